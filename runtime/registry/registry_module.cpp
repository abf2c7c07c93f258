// Module gantry_registry: being written; see include/gantry/registry.hpp.
