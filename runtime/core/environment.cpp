// The one reader of the process environment (include/gantry/environment.hpp): getenv for the named
// variables, one pass over environ for the prefixed families, and snapshots published whole.
#include "gantry/environment.hpp"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace gantry {
namespace {

struct Named {
    const char* name;
    EnvironmentVariable Environment::*field;
};

constexpr Named kNamed[] = {
    {"HOME", &Environment::home},
    {"PATH", &Environment::path},
    {"XDG_RUNTIME_DIR", &Environment::xdg_runtime_dir},
    {"XDG_CONFIG_HOME", &Environment::xdg_config_home},
    {"XDG_CACHE_HOME", &Environment::xdg_cache_home},
    {"XDG_DATA_HOME", &Environment::xdg_data_home},
    {"GANTRY_CONFIG", &Environment::gantry_config},
    {"GANTRY_STORE", &Environment::gantry_store},
    {"GANTRY_DEBUG", &Environment::gantry_debug},
    {"GANTRY_PULL_POLICY", &Environment::gantry_pull_policy},
    {"GANTRY_PULL_GROUP", &Environment::gantry_pull_group},
    {"GANTRY_CREDENTIAL_TIMEOUT", &Environment::gantry_credential_timeout},
    {"GANTRY_TRACE_FD", &Environment::gantry_trace_fd},
    {"GANTRY_STS_ENDPOINT", &Environment::gantry_sts_endpoint},
    {"GANTRY_ECR_ENDPOINT", &Environment::gantry_ecr_endpoint},
    {"GANTRY_TEST_ECR_REGISTRIES", &Environment::gantry_test_ecr_registries},
    {"GANTRY_RESOLVED_IMAGE", &Environment::gantry_resolved_image},
    {"GANTRY_STAGED_IMAGE", &Environment::gantry_staged_image},
    {"SSL_CERT_FILE", &Environment::ssl_cert_file},
    {"SSL_CERT_DIR", &Environment::ssl_cert_dir},
    {"DOCKER_CONFIG", &Environment::docker_config},
    {"REGISTRY_AUTH_FILE", &Environment::registry_auth_file},
    {"ENROOT_CONFIG_PATH", &Environment::enroot_config_path},
    {"AWS_CA_BUNDLE", &Environment::aws_ca_bundle},
    {"AWS_REGION", &Environment::aws_region},
    {"AWS_DEFAULT_REGION", &Environment::aws_default_region},
    {"AWS_ACCESS_KEY_ID", &Environment::aws_access_key_id},
    {"AWS_SECRET_ACCESS_KEY", &Environment::aws_secret_access_key},
    {"AWS_SESSION_TOKEN", &Environment::aws_session_token},
    {"AWS_PROFILE", &Environment::aws_profile},
    {"AWS_DEFAULT_PROFILE", &Environment::aws_default_profile},
    {"AWS_SHARED_CREDENTIALS_FILE", &Environment::aws_shared_credentials_file},
    {"AWS_CONFIG_FILE", &Environment::aws_config_file},
    {"AWS_WEB_IDENTITY_TOKEN_FILE", &Environment::aws_web_identity_token_file},
    {"AWS_ROLE_ARN", &Environment::aws_role_arn},
    {"AWS_ROLE_SESSION_NAME", &Environment::aws_role_session_name},
    {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", &Environment::aws_container_credentials_relative_uri},
    {"AWS_CONTAINER_CREDENTIALS_FULL_URI", &Environment::aws_container_credentials_full_uri},
    {"AWS_CONTAINER_AUTHORIZATION_TOKEN", &Environment::aws_container_authorization_token},
    {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &Environment::aws_container_authorization_token_file},
    {"AWS_EC2_METADATA_DISABLED", &Environment::aws_ec2_metadata_disabled},
    {"AWS_EC2_METADATA_SERVICE_ENDPOINT", &Environment::aws_ec2_metadata_service_endpoint},
    {"AWS_ENDPOINT_URL", &Environment::aws_endpoint_url},
    {"AWS_ENDPOINT_URL_STS", &Environment::aws_endpoint_url_sts},
    {"AWS_ENDPOINT_URL_ECR", &Environment::aws_endpoint_url_ecr},
    {"ENROOT_DATA_PATH", &Environment::enroot_data_path},
    {"ENROOT_FORCE_OVERRIDE", &Environment::enroot_force_override},
    {"ENROOT_ROOTFS_WRITABLE", &Environment::enroot_rootfs_writable},
    {"ENROOT_REMAP_ROOT", &Environment::enroot_remap_root},
    {"ENROOT_MOUNT_HOME", &Environment::enroot_mount_home},
    {"SLURM_CONF", &Environment::slurm_conf},
    {"SLURM_JOB_ID", &Environment::slurm_job_id},
    {"LISTEN_PID", &Environment::listen_pid},
    {"LISTEN_FDS", &Environment::listen_fds},
};

Environment read_environment() {
    Environment env;
    for (const auto& n : kNamed) {
        const char* v = std::getenv(n.name);
        if (v != nullptr) env.*n.field = EnvironmentVariable{true, v};
    }
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        std::string_view entry(*e);
        auto eq = entry.find('=');
        if (eq == std::string_view::npos) continue;
        std::string name(entry.substr(0, eq)), value(entry.substr(eq + 1));
        for (const char* prefix : kContainerFormPrefixes)
            if (name.rfind(prefix, 0) == 0) env.container_forms.emplace(name, value);
        if (name.rfind(kInheritedOptionPrefix, 0) == 0) env.inherited_options.emplace(name, value);
        for (const char* proxy : kProxyVariables)
            if (name == proxy) env.proxies.emplace(name, value);
    }
    return env;
}

bool same(const Environment& a, const Environment& b) {
    for (const auto& n : kNamed) {
        const EnvironmentVariable &x = a.*n.field, &y = b.*n.field;
        if (x.set != y.set || x.value != y.value) return false;
    }
    return a.container_forms == b.container_forms && a.inherited_options == b.inherited_options &&
           a.proxies == b.proxies;
}

std::mutex g_reread;
std::atomic<const Environment*> g_current{nullptr};

}  // namespace

const Environment& environment() {
    if (const Environment* now = g_current.load(std::memory_order_acquire)) return *now;
    return reread_environment();
}

const Environment& reread_environment() {
    std::lock_guard lock(g_reread);
    // Earlier snapshots stay alive (never freed, not even at exit: a static destructor must not pull
    // one from under a late reader such as a logging call).
    static auto* snapshots = new std::vector<std::unique_ptr<const Environment>>;
    Environment now = read_environment();
    // Unchanged (the usual case at a SPANK callback's entry): the current snapshot stays, so that a
    // long-lived host process does not collect copies.
    if (!snapshots->empty() && same(*snapshots->back(), now)) return *snapshots->back();
    snapshots->push_back(std::make_unique<const Environment>(std::move(now)));
    g_current.store(snapshots->back().get(), std::memory_order_release);
    return *snapshots->back();
}

void set_environment_variable(const char* name, const std::string& value) {
    (void)::setenv(name, value.c_str(), 1);
    reread_environment();
}

void unset_environment_variable(const char* name) {
    (void)::unsetenv(name);
    reread_environment();
}

}  // namespace gantry
