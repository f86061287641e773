#include "text/unicode.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace sieve::text {

namespace {
#include "text/unicode_data.inc"

constexpr uint32_t kReplacement = 0xFFFD;

// Lead byte -> expected length and allowed range of the second byte (RFC 3629 table 3-7).
struct Lead {
  int len;
  uint8_t lo, hi;
};
Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}
}  // namespace

int utf8_sequence_length(std::string_view s, size_t i) {
  Lead l = lead_of(static_cast<uint8_t>(s[i]));
  if (l.len <= 1) return l.len;
  for (int k = 1; k < l.len; ++k) {
    if (i + k >= s.size()) return -1;
    uint8_t c = static_cast<uint8_t>(s[i + k]);
    uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
    if (c < lo || c > hi) return 0;
  }
  return l.len;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    // ASCII runs are the common case: skip 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int len = utf8_sequence_length(s, i);
    if (len <= 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, const char* what) {
  size_t bad = find_invalid_utf8(s);
  if (bad != std::string_view::npos)
    throw Error(std::string(what) + " is not valid UTF-8 (bad byte 0x" +
                "0123456789abcdef"[static_cast<uint8_t>(s[bad]) >> 4] +
                "0123456789abcdef"[static_cast<uint8_t>(s[bad]) & 15] + " at byte offset " +
                std::to_string(bad) + ")");
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    int len = utf8_sequence_length(s, i);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    // A maximal subpart: the lead byte plus the continuation bytes that were still allowed.
    size_t j = i + 1;
    Lead l = lead_of(static_cast<uint8_t>(s[i]));
    for (int k = 1; k < l.len && j < s.size(); ++k, ++j) {
      uint8_t c = static_cast<uint8_t>(s[j]);
      uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
      if (c < lo || c > hi) break;
    }
    append_utf8(out, kReplacement);
    i = j;
  }
  return out;
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

struct NfcData {
  std::unordered_map<uint32_t, uint8_t> ccc;
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;
  std::unordered_map<uint64_t, uint32_t> comp;
  // Code points that can make a string change under NFC: those with a decomposition, a
  // nonzero class, or that can be the second of a composition (Hangul vowels and trailers).
  std::vector<bool> maybe;  // indexed up to 0x30000; above that only the tables decide
  NfcData() {
    maybe.assign(0x30000, false);
    for (auto& e : kCcc) {
      ccc[e[0]] = static_cast<uint8_t>(e[1]);
      if (e[0] < maybe.size()) maybe[e[0]] = true;
    }
    for (auto& e : kDecomp) {
      decomp[e[0]] = {e[1], e[2]};
      if (e[0] < maybe.size()) maybe[e[0]] = true;
    }
    for (auto& e : kComp) {
      comp[(uint64_t(e[0]) << 32) | e[1]] = e[2];
      if (e[1] < maybe.size()) maybe[e[1]] = true;
    }
    for (uint32_t c = kLBase; c < kLBase + kLCount + 0x100; ++c) maybe[c] = true;  // jamo
    for (uint32_t c = kVBase; c < kVBase + kVCount; ++c) maybe[c] = true;
    for (uint32_t c = kTBase; c < kTBase + kTCount; ++c) maybe[c] = true;
  }
  bool may_change(uint32_t cp) const {
    if (cp < maybe.size()) return maybe[cp];
    return ccc.count(cp) || decomp.count(cp);
  }
  uint8_t class_of(uint32_t cp) const {
    auto it = ccc.find(cp);
    return it == ccc.end() ? 0 : it->second;
  }
  void decompose(uint32_t cp, std::vector<uint32_t>& out) const {
    if (cp >= kSBase && cp < kSBase + kSCount) {
      uint32_t s = cp - kSBase;
      out.push_back(kLBase + s / kNCount);
      out.push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount) out.push_back(kTBase + s % kTCount);
      return;
    }
    auto it = decomp.find(cp);
    if (it == decomp.end()) {
      out.push_back(cp);
      return;
    }
    decompose(it->second.first, out);
    if (it->second.second) decompose(it->second.second, out);
  }
  uint32_t compose(uint32_t a, uint32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount)
      return a + (b - kTBase);
    auto it = comp.find((uint64_t(a) << 32) | b);
    return it == comp.end() ? 0 : it->second;
  }
};

const NfcData& nfc_data() {
  static const NfcData d;
  return d;
}

}  // namespace

std::string nfc(std::string_view s) {
  const NfcData& d = nfc_data();
  bool any = false;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0xCC) {  // below U+0300 nothing composes or reorders
      i += static_cast<uint8_t>(s[i]) < 0x80 ? 1 : 2;
      continue;
    }
    if (d.may_change(next_code_point(s, i))) {
      any = true;
      break;
    }
  }
  if (!any) return std::string(s);

  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) d.decompose(next_code_point(s, i), cps);
  // Canonical ordering: stable sort of each run of nonzero-class code points by class.
  for (size_t i = 0; i < cps.size();) {
    if (d.class_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && d.class_of(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [&](uint32_t a, uint32_t b) { return d.class_of(a) < d.class_of(b); });
    i = j;
  }
  // Canonical composition.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  long starter = -1;  // index in `out` of the last starter
  int last_class = -1;
  for (uint32_t cp : cps) {
    int cls = d.class_of(cp);
    if (starter >= 0) {
      bool blocked = last_class != -1 && (last_class == 0 || last_class >= cls);
      // Adjacent to the starter (nothing between) is never blocked.
      if (static_cast<size_t>(starter) + 1 == out.size()) blocked = false;
      if (!blocked) {
        if (uint32_t c = d.compose(out[starter], cp)) {
          out[starter] = c;
          continue;
        }
      }
    }
    if (cls == 0) {
      starter = static_cast<long>(out.size());
      last_class = -1;
    } else {
      last_class = cls;
    }
    out.push_back(cp);
  }
  std::string r;
  r.reserve(s.size());
  for (uint32_t cp : out) append_utf8(r, cp);
  return r;
}

}  // namespace sieve::text
