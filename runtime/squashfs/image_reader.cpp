// Reading one file out of a squashfs image without mounting it (libsquashfs). Used for the files an
// Enroot-made image keeps its settings in (/etc/environment). The image is user-controlled: the
// caller runs this as the user (see runtime/launcher/image_environment.cpp), and every size is capped.
#include <sqfs/compressor.h>
#include <sqfs/data_reader.h>
#include <sqfs/dir_reader.h>
#include <sqfs/error.h>
#include <sqfs/inode.h>
#include <sqfs/io.h>
#include <sqfs/super.h>

#include <memory>

#include "gantry/squashfs.hpp"
#include "sqfs_handles.hpp"

namespace gantry {

using squashfs::SqfsFree;
using squashfs::SqfsPtr;

Result<std::optional<std::string>> read_image_file(const std::string& image, const std::string& path,
                                                   size_t max_bytes) {
    std::string what = "reading " + path + " from image " + image;
    SqfsPtr<sqfs_file_t> file(sqfs_open_file(image.c_str(), SQFS_FILE_OPEN_READ_ONLY));
    if (!file) return make_error(what + ": cannot open the image");
    sqfs_super_t super{};
    if (sqfs_super_read(&super, file.get()) != 0) return make_error(what + ": not a squashfs image");
    sqfs_compressor_config_t cfg{};
    if (sqfs_compressor_config_init(&cfg, static_cast<SQFS_COMPRESSOR>(super.compression_id), super.block_size,
                                    SQFS_COMP_FLAG_UNCOMPRESS) != 0)
        return make_error(what + ": unsupported compressor");
    sqfs_compressor_t* raw_cmp = nullptr;
    if (sqfs_compressor_create(&cfg, &raw_cmp) != 0) return make_error(what + ": unsupported compressor");
    SqfsPtr<sqfs_compressor_t> cmp(raw_cmp);
    SqfsPtr<sqfs_dir_reader_t> dirs(sqfs_dir_reader_create(&super, cmp.get(), file.get(), 0));
    if (!dirs) return make_error(what + ": out of memory");
    sqfs_inode_generic_t* raw_root = nullptr;
    if (sqfs_dir_reader_get_root_inode(dirs.get(), &raw_root) != 0) return make_error(what + ": corrupt image");
    std::unique_ptr<sqfs_inode_generic_t, SqfsFree> root(raw_root);
    std::string rel = path;
    while (!rel.empty() && rel.front() == '/') rel.erase(rel.begin());
    sqfs_inode_generic_t* raw_inode = nullptr;
    int found = sqfs_dir_reader_find_by_path(dirs.get(), root.get(), rel.c_str(), &raw_inode);
    if (found == SQFS_ERROR_NO_ENTRY || found == SQFS_ERROR_NOT_DIR) return std::optional<std::string>();
    if (found != 0) return make_error(what + ": corrupt image");
    std::unique_ptr<sqfs_inode_generic_t, SqfsFree> inode(raw_inode);
    // Only a regular file counts; a symlink is not followed (documented in docs/user.md).
    if (inode->base.type != SQFS_INODE_FILE && inode->base.type != SQFS_INODE_EXT_FILE)
        return std::optional<std::string>();
    sqfs_u64 size = 0;
    if (sqfs_inode_get_file_size(inode.get(), &size) != 0) return make_error(what + ": corrupt image");
    if (size > max_bytes) return make_error(what + ": larger than " + std::to_string(max_bytes) + " bytes");
    SqfsPtr<sqfs_data_reader_t> data(sqfs_data_reader_create(file.get(), super.block_size, cmp.get(), 0));
    if (!data) return make_error(what + ": out of memory");
    if (sqfs_data_reader_load_fragment_table(data.get(), &super) != 0) return make_error(what + ": corrupt image");
    std::string text(static_cast<size_t>(size), '\0');
    sqfs_s32 n =
        size == 0 ? 0 : sqfs_data_reader_read(data.get(), inode.get(), 0, text.data(), static_cast<sqfs_u32>(size));
    if (n < 0 || static_cast<sqfs_u64>(n) != size) return make_error(what + ": corrupt image");
    return std::optional<std::string>(std::move(text));
}

}  // namespace gantry
