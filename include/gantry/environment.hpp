// The process environment as Gantry reads it: every variable the runtime, the CLI and the plugin honour,
// read in one place (runtime/core/environment.cpp, the only getenv of runtime/ and plugin/) into one
// struct with a field per variable. Code takes the value from `environment()`, never from getenv deep
// inside a library, so that a reader sees which settings come from the environment, and a test sets
// them in one place (STYLE.md, "Explicit inputs").
//
// Read once, lazily, on first use; read again only where the process's own environment changes:
//   - `set_environment_variable` / `unset_environment_variable`: the plugin's hand-over variables,
//     which srun/sbatch write into their own environment for the job (plugin/srun.cpp, stage.cpp,
//     telemetry.cpp) and read back within the same callback sequence, and the stage server's
//     removal of systemd's LISTEN_* once it took its socket;
//   - `reread_environment()`: at the entry of every SPANK callback (the host process, srun, sbatch or
//     slurmstepd, may have changed its environment between callbacks: srun sets the job's SLURM_*
//     variables once it has an allocation), and in unit tests after setenv.
// A snapshot once handed out is never freed, so a reference held across a re-read stays valid (and
// other threads reading it meanwhile are safe); a re-read that finds nothing changed keeps the current one.
//
// Not read here, on purpose:
//   - the job's environment in slurmstepd (spank_getenv / the step's env array: slurmstepd's own
//     environment is not the job's; plugin/slurm_env.cpp, env_forms.cpp);
//   - environments passed on whole to a child (`environ` copied into ProcessRequest::env: the user's
//     credentials and proxies for `gantry stage`, the container's variables);
//   - variables libcurl and OpenSSL read themselves (http_proxy, https_proxy, no_proxy, ALL_PROXY,
//     and OpenSSL's SSL_CERT_FILE/SSL_CERT_DIR defaults, which Gantry also reads to check them); the
//     proxies are also kept in `proxies`, only to be passed on to a pull a process starts;
//   - gantry-entry (runtime/entry/gantry_entry.c): a static C program exec'd as a task's first
//     process, which reads its own GANTRY_ENTRY_* variables and removes them before it execs the
//     entrypoint; it links nothing of the runtime's.
//
// Who reads what, and why: docs/admin.md, "Environment variables".
#pragma once

#include <map>
#include <string>

namespace gantry {

// One variable as read: unset, or set (possibly to the empty string). Most readers treat empty as unset
// and use `value`; `set` is there for the few that do not (PATH, SLURM_CONF, the hand-over variables).
struct EnvironmentVariable {
    bool set = false;
    std::string value;  // "" when unset
    bool empty() const { return value.empty(); }
};

struct Environment {
    // The user's directories (store, credentials, runtime state, the enroot command's data).
    EnvironmentVariable home;             // HOME
    EnvironmentVariable path;             // PATH: helper programs; a holder started by its user inherits it
    EnvironmentVariable xdg_runtime_dir;  // XDG_RUNTIME_DIR: container state; containers/auth.json
    EnvironmentVariable xdg_config_home;  // XDG_CONFIG_HOME: containers/auth.json, enroot's .credentials
    EnvironmentVariable xdg_cache_home;   // XDG_CACHE_HOME: the default store, the token cache
    EnvironmentVariable xdg_data_home;    // XDG_DATA_HOME: the enroot command's data path

    // Gantry's own.
    EnvironmentVariable gantry_config;               // GANTRY_CONFIG: gantry.conf to read instead of /etc/gantry's
    EnvironmentVariable gantry_store;                // GANTRY_STORE: the image store (after --store)
    EnvironmentVariable gantry_debug;                // GANTRY_DEBUG: debug lines when set and not 0
    EnvironmentVariable gantry_pull_policy;          // GANTRY_PULL_POLICY: always, missing or never
    EnvironmentVariable gantry_pull_group;           // GANTRY_PULL_GROUP: the step's pull group (stepd)
    EnvironmentVariable gantry_credential_timeout;   // GANTRY_CREDENTIAL_TIMEOUT: seconds for a credential helper
    EnvironmentVariable gantry_trace_fd;             // GANTRY_TRACE_FD: the holder's trace descriptor
    EnvironmentVariable gantry_sts_endpoint;         // GANTRY_STS_ENDPOINT: AWS STS endpoint (tests, private)
    EnvironmentVariable gantry_ecr_endpoint;         // GANTRY_ECR_ENDPOINT: ECR API endpoint (tests, private)
    EnvironmentVariable gantry_test_ecr_registries;  // GANTRY_TEST_ECR_REGISTRIES: test-only ECR stand-ins
    // The plugin's hand-over from srun/sbatch to the job (plugin/step_internal.hpp).
    EnvironmentVariable gantry_resolved_image;  // GANTRY_RESOLVED_IMAGE
    EnvironmentVariable gantry_staged_image;    // GANTRY_STAGED_IMAGE

    // TLS and registry credentials.
    EnvironmentVariable ssl_cert_file;       // SSL_CERT_FILE
    EnvironmentVariable ssl_cert_dir;        // SSL_CERT_DIR
    EnvironmentVariable docker_config;       // DOCKER_CONFIG: directory of config.json
    EnvironmentVariable registry_auth_file;  // REGISTRY_AUTH_FILE: containers auth.json
    EnvironmentVariable enroot_config_path;  // ENROOT_CONFIG_PATH: enroot's .credentials (netrc)

    // AWS (ECR credentials), as the AWS SDKs read them.
    EnvironmentVariable aws_ca_bundle;                           // AWS_CA_BUNDLE
    EnvironmentVariable aws_region;                              // AWS_REGION
    EnvironmentVariable aws_default_region;                      // AWS_DEFAULT_REGION
    EnvironmentVariable aws_access_key_id;                       // AWS_ACCESS_KEY_ID
    EnvironmentVariable aws_secret_access_key;                   // AWS_SECRET_ACCESS_KEY
    EnvironmentVariable aws_session_token;                       // AWS_SESSION_TOKEN
    EnvironmentVariable aws_profile;                             // AWS_PROFILE
    EnvironmentVariable aws_default_profile;                     // AWS_DEFAULT_PROFILE
    EnvironmentVariable aws_shared_credentials_file;             // AWS_SHARED_CREDENTIALS_FILE
    EnvironmentVariable aws_config_file;                         // AWS_CONFIG_FILE
    EnvironmentVariable aws_web_identity_token_file;             // AWS_WEB_IDENTITY_TOKEN_FILE
    EnvironmentVariable aws_role_arn;                            // AWS_ROLE_ARN
    EnvironmentVariable aws_role_session_name;                   // AWS_ROLE_SESSION_NAME
    EnvironmentVariable aws_container_credentials_relative_uri;  // AWS_CONTAINER_CREDENTIALS_RELATIVE_URI
    EnvironmentVariable aws_container_credentials_full_uri;      // AWS_CONTAINER_CREDENTIALS_FULL_URI
    EnvironmentVariable aws_container_authorization_token;       // AWS_CONTAINER_AUTHORIZATION_TOKEN
    EnvironmentVariable aws_container_authorization_token_file;  // AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE
    EnvironmentVariable aws_ec2_metadata_disabled;               // AWS_EC2_METADATA_DISABLED
    EnvironmentVariable aws_ec2_metadata_service_endpoint;       // AWS_EC2_METADATA_SERVICE_ENDPOINT
    EnvironmentVariable aws_endpoint_url;                        // AWS_ENDPOINT_URL
    EnvironmentVariable aws_endpoint_url_sts;                    // AWS_ENDPOINT_URL_STS
    EnvironmentVariable aws_endpoint_url_ecr;                    // AWS_ENDPOINT_URL_ECR

    // The enroot command (runtime/cli/enroot.cpp), Enroot's own settings.
    EnvironmentVariable enroot_data_path;        // ENROOT_DATA_PATH
    EnvironmentVariable enroot_force_override;   // ENROOT_FORCE_OVERRIDE
    EnvironmentVariable enroot_rootfs_writable;  // ENROOT_ROOTFS_WRITABLE
    EnvironmentVariable enroot_remap_root;       // ENROOT_REMAP_ROOT
    EnvironmentVariable enroot_mount_home;       // ENROOT_MOUNT_HOME

    // Slurm's, in srun's or the CLI's process.
    EnvironmentVariable slurm_conf;    // SLURM_CONF
    EnvironmentVariable slurm_job_id;  // SLURM_JOB_ID: srun runs inside a job

    // systemd's socket activation (gantry stage-server): the process meant and how many sockets.
    EnvironmentVariable listen_pid;  // LISTEN_PID
    EnvironmentVariable listen_fds;  // LISTEN_FDS

    // The site's proxies (kProxyVariables), set ones only: libcurl reads them itself in this process;
    // these are what a process passes on to the pulls it starts (the stage server's store-account pulls).
    std::map<std::string, std::string> proxies;

    // Families read by prefix, whole name -> value (srun's environment, where the plugin checks them):
    // GANTRY_CONTAINER_* and PYXIS_CONTAINER_* (the options' environment forms), and
    // SLURM_SPANK__SLURM_SPANK_OPTION_gantry_* (options sbatch hands to the job's sruns).
    std::map<std::string, std::string> container_forms;
    std::map<std::string, std::string> inherited_options;
};

// The proxy variables, as libcurl and the AWS CLI read them.
inline constexpr const char* kProxyVariables[] = {"http_proxy", "https_proxy", "no_proxy",
                                                  "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"};

// Prefixes of the families above.
inline constexpr const char* kContainerFormPrefixes[] = {"GANTRY_CONTAINER_", "PYXIS_CONTAINER_"};
inline constexpr const char* kInheritedOptionPrefix = "SLURM_SPANK__SLURM_SPANK_OPTION_gantry_";

// The environment as last read (read on first use).
const Environment& environment();

// Reads the process environment again and returns the new snapshot.
const Environment& reread_environment();

// setenv/unsetenv of this process's environment, and the snapshot follows.
void set_environment_variable(const char* name, const std::string& value);
void unset_environment_variable(const char* name);

}  // namespace gantry
