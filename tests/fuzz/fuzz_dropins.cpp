// Site drop-ins and --container-env style text: environ.d files (parse_environment_file, strict and
// lenient as for an image's /etc/environment), mounts.d fstab files (parse_fstab_file), ${NAME}
// expansion and an Enroot image's /etc/rc (parse_enroot_rc). The first byte picks.
#include "fuzz.hpp"
#include "gantry/dropins.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    if (size == 0) return 0;
    auto text = fuzz::text_of(data + 1, size - 1);
    static const std::vector<std::string> env = {"HOME=/home/u", "USER=u", "SLURM_JOB_ID=42", "EMPTY="};
    switch (data[0] % 5) {
        case 0:
        case 1:
            if (auto vars = parse_environment_file(text, env, "fuzz.env", data[0] % 5 == 1))
                for (const auto& v : *vars) FUZZ_CHECK(v.find('=') != std::string::npos && v[0] != '=');
            break;
        case 2:
            if (auto mounts = parse_fstab_file(text, env, "fuzz.fstab"))
                for (const auto& m : *mounts) {
                    FUZZ_CHECK(!m.mount.destination.empty() && m.mount.destination[0] == '/');
                    FUZZ_CHECK(m.mount.destination.find("/../") == std::string::npos);
                    FUZZ_CHECK(m.mount.destination.find('\0') == std::string::npos);
                    FUZZ_CHECK(m.mount.source.find('\0') == std::string::npos);
                }
            break;
        case 4: {
            auto rc = parse_enroot_rc(text);
            // `cd "DIR"` gives DIR without '"', '$', '`' or '\'; `cd 'DIR'` (gantry export's ${DIR@Q}) may hold
            // them literally. Either way: absolute, one line, and no NUL (the helper's reply separator).
            FUZZ_CHECK(rc.workdir.empty() || (rc.workdir[0] == '/' && rc.workdir.find_first_of(std::string_view(
                                                                          "\n\0", 2)) == std::string::npos));
            for (const auto& w : rc.entrypoint) FUZZ_CHECK(w.find('\0') == std::string::npos);
            for (const auto& w : rc.cmd) FUZZ_CHECK(w.find('\0') == std::string::npos);
            break;
        }
        default:
            (void)expand_variables(text, env);
    }
    return 0;
}
