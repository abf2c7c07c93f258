// Module gantry_squashfs: being written; see include/gantry/squashfs.hpp.
