// Internal: owning handles for libsquashfs objects, shared by the readers of finished images
// (image_reader.cpp, image_rewrite.cpp).
#pragma once

#include <sqfs/io.h>

#include <memory>

namespace gantry::squashfs {

// Objects made by sqfs_*_create/open (sqfs_destroy).
struct SqfsDestroy {
    void operator()(void* obj) const {
        if (obj != nullptr) sqfs_destroy(obj);
    }
};
template <typename T>
using SqfsPtr = std::unique_ptr<T, SqfsDestroy>;

// Memory libsquashfs hands out (inodes, directory entries): sqfs_free.
struct SqfsFree {
    void operator()(void* p) const { sqfs_free(p); }
};

}  // namespace gantry::squashfs
