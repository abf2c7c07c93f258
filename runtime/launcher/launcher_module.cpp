// Module gantry_launcher: being written; see include/gantry/launcher.hpp.
