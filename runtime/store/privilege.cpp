// The store's one privileged step: root's `gantry gc`/`rm` in a store that one unprivileged account
// owns (a per-user store, or the store_owner store) become that account before touching anything.
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <vector>

#include "gantry/store.hpp"

namespace gantry {

Status become_store_owner(uid_t uid) {
    // Why this is safe: it only ever gives privilege away. Root acting in a store that an ordinary
    // account owns would act on whatever that account planted there (symlinks, FIFOs, files of
    // others hard-linked in); as the owner, every unlink and open is checked by the kernel against the
    // owner's own rights, so the worst a planted entry can do is make the owner's gc remove the
    // owner's files. Supplementary groups go first (setgroups needs root), then the gid, then the uid;
    // all three ids of each are set, and the result is verified, including that root cannot come back.
    if (::geteuid() != 0)
        return make_error("becoming the store owner uid " + std::to_string(uid) + ": not running as root");
    if (uid == 0) return make_error("becoming the store owner: the store is root's; nothing to drop");
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
        return make_error("becoming the store owner uid " + std::to_string(uid) +
                          ": no such account on this node; run this as that account, or fix the store's ownership");
    const gid_t gid = pw.pw_gid;
    const std::string what = "becoming the store owner " + std::string(pw.pw_name);
    if (::setgroups(1, &gid) != 0) return system_error(what + ": setgroups");
    if (::setresgid(gid, gid, gid) != 0) return system_error(what + ": setresgid");
    if (::setresuid(uid, uid, uid) != 0) return system_error(what + ": setresuid");
    uid_t ru = 0, eu = 0, su = 0;
    gid_t rg = 0, eg = 0, sg = 0;
    if (::getresuid(&ru, &eu, &su) != 0 || ::getresgid(&rg, &eg, &sg) != 0 || ru != uid || eu != uid || su != uid ||
        rg != gid || eg != gid || sg != gid)
        return make_error(what + ": the ids did not change as asked");
    if (::setuid(0) == 0) return make_error(what + ": root could be regained; refusing to go on");
    return {};
}

}  // namespace gantry
