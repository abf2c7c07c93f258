// The holder's replies to its creator (holder.cpp, namespaces.cpp -> start_holder in container.cpp),
// typed like its request (HolderRequest, internal.hpp): one JSON document per line, encoded and decoded
// in one place (spec_json.cpp), so that a message is a value with a kind and fields, never text to take
// apart.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "gantry/result.hpp"

namespace gantry::launcher {

// What the holder says on the socket its creator started it with:
//   userns  the holder `pid` has made its user namespace and waits: root, creating it for a user,
//           writes its id maps (write_id_maps) and answers kHolderGo;
//   ready   the container is set up: the holder's pid and start time, and those of its shared image
//           server (server_pid -1: none), as numbers of the holder's pid namespace (pid_namespace: a
//           job's own under Slurm's namespace/linux may differ from the creator's); the holder then
//           closes the socket;
//   failed  the set-up failed, `message` says why; the holder cleans up and exits.
struct HolderReply {
    enum class Kind { userns, ready, failed };
    Kind kind = Kind::failed;
    pid_t pid = -1;
    unsigned long long start_time = 0;
    unsigned long long pid_namespace = 0;  // ready: the pid namespace (its inode) pid and server_pid are numbers of
    pid_t server_pid = -1;
    unsigned long long server_start_time = 0;
    std::string message;
};
// Creator to holder, after it wrote the maps.
inline constexpr std::string_view kHolderGo = "go\n";
// Bounds what a creator reads from a holder (it stops reading past this).
inline constexpr size_t kMaxHolderReplyBytes = 65536;
// One line, ending in a newline (a message's own newlines are escaped in the JSON).
std::string holder_reply_to_line(const HolderReply& reply);
// One line, with or without its newline; strict like the request's parser.
Result<HolderReply> holder_reply_from_line(std::string_view line);

}  // namespace gantry::launcher
