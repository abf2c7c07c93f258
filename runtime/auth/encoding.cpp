// Base64 for credentials: Docker's `auth` fields, ECR's authorizationToken, Basic Authorization values.
// Shared by every credential source and by the registry client's Basic/Bearer code. OpenSSL's block
// coder does the work; around it, what the encoded values in the wild need: padding may be left out,
// and the URL-safe alphabet ('-', '_') is read too.
#include <openssl/evp.h>

#include <cctype>

#include "gantry/auth.hpp"

namespace gantry {

std::string base64_encode(std::string_view data) {
    std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock adds a NUL
    int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(data.data()), static_cast<int>(data.size()));
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
    while (!text.empty() && text.back() == '=') text.remove_suffix(1);
    if (text.size() % 4 == 1) return std::nullopt;  // a lone trailing character
    std::string in(text);
    for (char& ch : in) {
        if (ch == '-')
            ch = '+';
        else if (ch == '_')
            ch = '/';
        // EVP_DecodeBlock skips blanks at either end; inside a value nothing but the alphabet passes.
        else if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '+' || ch == '/'))
            return std::nullopt;
    }
    size_t pad = (4 - in.size() % 4) % 4;
    in.append(pad, '=');
    std::string out(in.size() / 4 * 3, '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
    if (n < 0 || static_cast<size_t>(n) < pad) return std::nullopt;
    out.resize(static_cast<size_t>(n) - pad);  // the block coder counts the padding's bytes too
    return out;
}

}  // namespace gantry
