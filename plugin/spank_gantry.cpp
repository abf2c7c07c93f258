// The SPANK entry points of spank_gantry.so: Slurm glue only. Every callback catches everything, so
// nothing unwinds into srun or slurmstepd.
extern "C" {
#include <slurm/slurm_version.h>
#include <slurm/spank.h>
}

#include <fcntl.h>

#include <cstdio>
#include <exception>
#include <string>

#include "gantry/environment.hpp"
#include "gantry/log.hpp"
#include "gantry/trace.hpp"
#include "gantry/version.hpp"
#include "options.hpp"
#include "settings.hpp"
#include "step.hpp"
#include "telemetry.hpp"

// SPANK_PLUGIN() defines const globals, which C++ gives internal linkage; declare them extern "C"
// first so that Slurm's dlsym() finds them (otherwise: "Plugin name/type/version symbol missing").
extern "C" {
__attribute__((visibility("default"))) extern const char plugin_name[];
__attribute__((visibility("default"))) extern const char plugin_type[];
__attribute__((visibility("default"))) extern const unsigned int plugin_version;
__attribute__((visibility("default"))) extern const unsigned int spank_plugin_version;
}
SPANK_PLUGIN(gantry, 1)

#ifdef GANTRY_HAVE_SPANK_INIT_FAILURE_MODE
// Slurm 25.05 and later: when slurm_spank_init fails in slurmstepd (a plugin built for another release,
// a gantry.conf the node cannot use), fail the job that met it rather than drain the node, which is
// Slurm's default. The headers declare it extern "C"; plugin/CMakeLists.txt checks they do.
__attribute__((visibility("default"))) int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

#define GANTRY_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

gantry::plugin::Settings g_settings;

// "gantry-built-for-slurm=22.05" in the file: `gantry doctor` reads it to compare the installed plugin
// with the running Slurm without dlopen()ing it. A constant array: nothing runs at load time.
[[gnu::used]] constexpr char kBuiltForSlurm[] = GANTRY_SLURM_MARKER GANTRY_SLURM_RELEASE;

// Library messages go through Slurm's logging, which reaches the user's terminal for srun.
void route_log_to_slurm() {
    gantry::log::set_sink([](gantry::log::Level level, const std::string& m) {
        if (level == gantry::log::Level::error)
            slurm_error("gantry: %s", m.c_str());
        else if (level == gantry::log::Level::warning)
            slurm_info("gantry: warning: %s", m.c_str());
        else if (level == gantry::log::Level::info)
            slurm_verbose("gantry: %s", m.c_str());
        else
            slurm_debug("gantry: %s", m.c_str());
    });
}

// SPANK's ABI follows Slurm's major release ("22.05"): the one in the headers we were built with must
// be the one running. "22.05.8" -> 22 * 256 + 5, the same encoding as SLURM_VERSION_NUMBER >> 8.
int release_of(const char* version) {
    unsigned major = 0, minor = 0;
    if (std::sscanf(version, "%u.%u", &major, &minor) != 2) return -1;
    return static_cast<int>(major * 256 + minor);
}
constexpr int kBuiltRelease = SLURM_VERSION_NUMBER >> 8;

template <typename F>
int guarded(const char* hook, F&& f) {
    try {
        // The host process (srun, sbatch, salloc, slurmstepd) may have changed its own environment since
        // the last callback (srun exports the job's SLURM_* variables once it has an allocation): the
        // library's view of it (include/gantry/environment.hpp) is read afresh for each callback.
        gantry::reread_environment();
        return f();
    } catch (const std::exception& e) {
        slurm_error("gantry: internal error in %s: %s", hook, e.what());
    } catch (...) {
        slurm_error("gantry: internal error in %s", hook);
    }
    return -1;
}

}  // namespace

GANTRY_EXPORT int slurm_spank_init(spank_t sp, int argc, char** argv) {
    return guarded("slurm_spank_init", [&] {
        if (spank_context() == S_CTX_REMOTE) gantry::plugin::watch_step_signals();
        route_log_to_slurm();
        char* running = nullptr;
        if (spank_get_item(sp, S_SLURM_VERSION, &running) == ESPANK_SUCCESS && running != nullptr &&
            release_of(running) != kBuiltRelease) {
            slurm_error(
                "gantry: spank_gantry.so was built for Slurm %d.%02d but this is Slurm %s; rebuild it against "
                "this Slurm's libslurm-dev (see docs/admin.md)",
                kBuiltRelease >> 8, kBuiltRelease & 0xff, running);
            return -1;
        }
        auto settings = gantry::plugin::parse_settings(argc, argv);
        if (!settings) {
            slurm_error("gantry: %s", settings.error().message.c_str());
            return -1;
        }
        g_settings = *settings;
        // Trace points (bench/srun.sh --breakdown): appended to a file that must exist already (the
        // bench makes it); never created or followed through a link here, by root or by the user.
        if (!g_settings.trace.empty() && gantry::trace::descriptor() < 0) {
            int fd = ::open(g_settings.trace.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (fd >= 0) gantry::trace::enable(fd);
        }
        gantry::plugin::record_start_points();  // start-up telemetry (plugin/telemetry.hpp)
        gantry::trace::point(spank_context() == S_CTX_LOCAL ? "srun init" : "plugin init");
        for (auto* opt = gantry::plugin::option_table(); opt->name != nullptr; ++opt) {
            if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
                slurm_error("gantry: could not register option --%s", opt->name);
                return -1;
            }
        }
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_init_post_opt(spank_t sp, int, char**) {
    return guarded("slurm_spank_init_post_opt", [&] {
        switch (spank_context()) {
            case S_CTX_LOCAL:
                gantry::plugin::check_environment_forms();
                {
                    // Already printed on srun's terminal (srun.cpp): srun adds its own line and stops.
                    bool pinned = false;
                    {
                        gantry::trace::Phase phase("srun pin_image_digest");
                        pinned = static_cast<bool>(gantry::plugin::pin_image_digest(sp, g_settings));
                    }
                    gantry::plugin::hand_srun_times();
                    return pinned ? 0 : -1;
                }
            case S_CTX_ALLOCATOR:
                gantry::plugin::check_environment_forms();
                gantry::plugin::clear_resolved_image();
                // Already printed on the user's terminal (stage.cpp): sbatch adds its own line and stops.
                return gantry::plugin::stage_at_submit(sp, g_settings) ? 0 : -1;
            case S_CTX_REMOTE:
                gantry::plugin::apply_environment(sp);
                // Failures are kept and reported by every task (slurm_spank_task_init), so the step
                // fails with the message and the node is never drained for it.
                {
                    gantry::trace::Phase phase("prepare_step");
                    (void)gantry::plugin::prepare_step(sp, g_settings);
                }
                gantry::plugin::start_record_armed(sp);
                return 0;
            default:
                return 0;
        }
    });
}

// srun only, once its allocation is granted: a stage armed while it waited is no longer needed (stage.cpp).
GANTRY_EXPORT int slurm_spank_local_user_init(spank_t, int, char**) {
    return guarded("slurm_spank_local_user_init", [&] {
        gantry::trace::point("srun local_user_init");
        gantry::plugin::allocation_granted();
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_user_init(spank_t, int, char**) {
    return guarded("slurm_spank_user_init", [&] {
        // Slurm ignores this hook's result; failures are kept for slurm_spank_task_init.
        if (spank_context() == S_CTX_REMOTE) {
            gantry::plugin::check_image_base();
            gantry::plugin::resolve_save_path();
        }
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_task_init_privileged(spank_t sp, int, char**) {
    return guarded("slurm_spank_task_init_privileged", [&] {
        gantry::trace::Phase phase("task_init_privileged");
        if (spank_context() == S_CTX_REMOTE) gantry::plugin::prepare_task(sp);
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_task_post_fork(spank_t sp, int, char**) {
    return guarded("slurm_spank_task_post_fork", [&] {
        gantry::trace::Phase phase("task_post_fork");
        if (spank_context() == S_CTX_REMOTE) {
            gantry::plugin::task_forked(sp);
            gantry::plugin::start_record_tasks_forked();
        }
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_task_init(spank_t sp, int, char**) {
    return guarded("slurm_spank_task_init", [&] {
        if (!gantry::plugin::option_error().empty()) {
            slurm_error("%s", gantry::plugin::option_error().c_str());
            return -1;
        }
        gantry::trace::Phase phase("join_step");  // the task's last point before Slurm execs it
        auto st = gantry::plugin::join_step(sp);
        if (!st) {
            slurm_error("gantry: %s", st.error().message.c_str());
            return -1;
        }
        gantry::plugin::start_record_task_execs();
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_task_exit(spank_t sp, int, char**) {
    return guarded("slurm_spank_task_exit", [&] {
        gantry::trace::Phase phase("task_exit");
        if (spank_context() == S_CTX_REMOTE) gantry::plugin::task_exited(sp, g_settings);
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_exit(spank_t sp, int, char**) {
    return guarded("slurm_spank_exit", [&] {
        gantry::trace::point(spank_context() == S_CTX_LOCAL ? "srun exit" : "plugin exit");
        if (spank_context() == S_CTX_REMOTE) {
            gantry::plugin::start_record_finish();
            gantry::plugin::finish_step(sp, g_settings);
        }
        if (spank_context() == S_CTX_LOCAL) gantry::plugin::stop_import_watch();
        return 0;
    });
}

GANTRY_EXPORT int slurm_spank_job_epilog(spank_t sp, int, char**) {
    return guarded("slurm_spank_job_epilog", [&] {
        gantry::plugin::clean_up_job(sp, g_settings);
        return 0;
    });
}
