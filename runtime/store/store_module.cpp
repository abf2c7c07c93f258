// Module gantry_store: being written; see include/gantry/store.hpp.
