// The SPANK entry points of spank_gantry.so. Slurm glue only: option registration and the hook
// sequence; everything else is delegated to the gantry runtime library.
extern "C" {
#include <slurm/spank.h>
}

#include <cstring>
#include <string>

// SPANK_PLUGIN() defines const globals, which C++ gives internal linkage; declare them extern "C"
// first so that Slurm's dlsym() finds them (otherwise: "Plugin name/type/version symbol missing").
extern "C" {
extern const char plugin_name[];
extern const char plugin_type[];
extern const unsigned int plugin_version;
extern const unsigned int spank_plugin_version;
}
SPANK_PLUGIN(gantry, 1)

namespace {

std::string g_image;

int on_image(int, const char* optarg, int) {
    if (optarg == nullptr || *optarg == '\0') {
        slurm_error("gantry: --container-image: empty image name");
        return -1;
    }
    if (!g_image.empty() && g_image != optarg) {
        slurm_error("gantry: --container-image specified multiple times");
        return -1;
    }
    g_image = optarg;
    return 0;
}

struct spank_option g_options[] = {
    {const_cast<char*>("container-image"), const_cast<char*>("[USER@][REGISTRY#]IMAGE[:TAG]|PATH"),
     const_cast<char*>("[gantry] the image to run the job step in (Pyxis-compatible)"), 1, 0, on_image},
    SPANK_OPTIONS_TABLE_END,
};

}  // namespace

extern "C" int slurm_spank_init(spank_t sp, int, char**) {
    try {
        for (auto* opt = g_options; opt->name != nullptr; ++opt)
            if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
                slurm_error("gantry: could not register option --%s", opt->name);
                return -1;
            }
        return 0;
    } catch (...) {
        return -1;
    }
}

extern "C" int slurm_spank_task_init(spank_t, int, char**) {
    if (g_image.empty()) return 0;
    slurm_error("gantry: containers in Slurm steps are not implemented yet (image %s)", g_image.c_str());
    return -1;
}
