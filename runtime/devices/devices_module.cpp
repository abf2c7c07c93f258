// Module gantry_devices: being written; see include/gantry/devices.hpp.
