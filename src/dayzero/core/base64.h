#pragma once
// Standard base64 (RFC 4648 alphabet, '=' padding): tiktoken vocabularies, image data URLs and
// image bytes over the worker protocol.

#include <optional>
#include <string>
#include <string_view>

namespace dz {

// Strict: the length a multiple of 4, '=' only as the last one or two characters, no whitespace,
// zero leftover bits. nullopt for anything else, and for the empty text.
std::optional<std::string> decode_base64(std::string_view text);

// Padded to a multiple of 4 characters.
std::string encode_base64(std::string_view bytes);

}  // namespace dz
