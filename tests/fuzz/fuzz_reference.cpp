// Image references as users type them (--container-image, `gantry pull`): parse_reference, and the
// canonical spelling it produces must parse again to the same reference.
#include "fuzz.hpp"
#include "gantry/reference.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gantry;
    auto text = fuzz::text_of(data, size);
    (void)is_local_image_path(text);
    auto ref = parse_reference(text);
    if (!ref) return 0;
    FUZZ_CHECK(!ref->registry.empty() && !ref->repository.empty());
    FUZZ_CHECK(!ref->tag.empty() || !ref->digest.empty());
    (void)ref->registry_is_loopback();
    auto again = parse_reference(ref->str());
    FUZZ_CHECK(static_cast<bool>(again));
    FUZZ_CHECK(again->registry == ref->registry && again->repository == ref->repository);
    FUZZ_CHECK(again->digest == ref->digest);
    return 0;
}
