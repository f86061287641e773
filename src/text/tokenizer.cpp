#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace sieve::text {

namespace {

using json = nlohmann::json;

// GPT-2's byte <-> printable character table (bytes_to_unicode in the original encoder.py).
struct ByteLevelTable {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte;  // code point -> byte, -1 if not in the table
  ByteLevelTable() {
    int n = 0;
    to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + n++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable t;
  return t;
}

// Byte-level token text -> raw bytes; nullopt when a character is outside the table.
std::optional<std::string> byte_level_decode(std::string_view tok) {
  const auto& t = byte_level();
  std::string out;
  for (size_t i = 0; i < tok.size();) {
    uint32_t cp = next_code_point(tok, i);
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.to_byte[cp]);
  }
  return out;
}

// The GPT-2 pre-tokenization pattern ByteLevel applies when use_regex is true.
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
}

// A token in tokenizer_config.json is a string or an AddedToken object {"content": ...}.
std::string token_string(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

bool is_unicode_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Hash for string-keyed maps that are looked up with string_views (no temporary strings).
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using SvMap = std::unordered_map<std::string, V, SvHash, std::equal_to<>>;

std::atomic<uint64_t> next_serial{1};

// Per-thread cache of word -> ids: prose repeats words, and BPE dominates encode time. Keyed
// by the tokenizer's serial number, not its address, so a new tokenizer never sees old entries.
struct WordCache {
  uint64_t owner = 0;
  SvMap<std::vector<int32_t>> map;
};
WordCache& word_cache(uint64_t serial) {
  thread_local WordCache c;
  if (c.owner != serial || c.map.size() > 100000) {
    c.map.clear();
    c.owner = serial;
  }
  return c;
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::shared_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool lstrip, rstrip, single_word, normalized, special;
};

// Finds added tokens in text: leftmost match, longest at that position (what the Rust crate's
// aho-corasick LeftmostLongest does).
struct AddedMatcher {
  SvMap<size_t> by_content;     // -> index in tokens
  std::vector<size_t> lengths;  // distinct, longest first
  std::array<bool, 256> first{};
  const std::vector<AddedToken>* tokens = nullptr;

  void add(size_t idx) {
    const std::string& c = (*tokens)[idx].content;
    if (c.empty()) return;
    by_content.emplace(c, idx);
    first[static_cast<uint8_t>(c[0])] = true;
    if (std::find(lengths.begin(), lengths.end(), c.size()) == lengths.end())
      lengths.push_back(c.size());
    std::sort(lengths.rbegin(), lengths.rend());
  }
  bool empty() const { return by_content.empty(); }
};

struct Segment {
  std::string_view text;  // when id < 0
  int32_t id = -1;
};

bool is_word_char(uint32_t cp) {
  return cp == '_' || (cp < 0x80 ? std::isalnum(static_cast<int>(cp)) != 0 : !is_unicode_space(cp));
}

uint32_t code_point_before(std::string_view s, size_t end) {
  size_t i = end;
  do --i;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80);
  return next_code_point(s, i);
}

}  // namespace

struct TokenizerImpl {
  std::string origin;
  uint64_t serial = next_serial++;
  // Model
  SvMap<int32_t> vocab;  // raw bytes -> id
  std::array<int32_t, 256> byte_id{};
  struct Merge {
    int32_t rank, new_id;
  };
  std::unordered_map<uint64_t, Merge> merges;
  bool ignore_merges = false;
  // Pipeline
  bool nfc = false;
  std::vector<PreTokStep> pre;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, norm_matcher;
  // Id tables
  int32_t size = 0;
  std::vector<std::string> id_text;   // as in tokenizer.json
  std::vector<std::string> id_bytes;  // what decoding yields
  std::vector<bool> special;
  // Config
  std::vector<int32_t> prefix_ids, suffix_ids;  // added by add_special_tokens
  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  std::string bos_tok, eos_tok, chat_template;
  bool add_bos = false;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void split_added(std::string_view text, const AddedMatcher& m, std::vector<Segment>& out) const {
    if (m.empty()) {
      if (!text.empty()) out.push_back({text, -1});
      return;
    }
    size_t start = 0;  // beginning of the pending plain text
    size_t i = 0;
    while (i < text.size()) {
      if (!m.first[static_cast<uint8_t>(text[i])]) {
        ++i;
        continue;
      }
      const AddedToken* hit = nullptr;
      size_t len = 0;
      for (size_t l : m.lengths) {
        if (i + l > text.size()) continue;
        auto it = m.by_content.find(text.substr(i, l));
        if (it != m.by_content.end()) {
          hit = &added[it->second];
          len = l;
          break;
        }
      }
      if (hit && hit->single_word) {
        bool before_ok = i == 0 || !is_word_char(code_point_before(text, i));
        size_t j = i + len;
        bool after_ok = j >= text.size() || !is_word_char(next_code_point(text, j));
        if (!before_ok || !after_ok) hit = nullptr;
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t a = i, b = i + len;
      if (hit->lstrip) {
        while (a > start) {
          size_t p = a;
          do --p;
          while (p > start && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80);
          size_t q = p;
          if (!is_unicode_space(next_code_point(text, q))) break;
          a = p;
        }
      }
      if (hit->rstrip) {
        while (b < text.size()) {
          size_t q = b;
          if (!is_unicode_space(next_code_point(text, q))) break;
          b = q;
        }
      }
      if (a > start) out.push_back({text.substr(start, a - start), -1});
      out.push_back({{}, hit->id});
      start = i = b;
    }
    if (start < text.size()) out.push_back({text.substr(start), -1});
  }

  void pre_tokenize(std::string_view text, std::vector<std::string_view>& pieces,
                    std::deque<std::string>& owned) const {
    pieces.clear();
    pieces.push_back(text);
    std::vector<std::string_view> next;
    for (const PreTokStep& step : pre) {
      next.clear();
      for (std::string_view p : pieces) {
        if (step.kind == PreTokStep::kByteLevel && step.add_prefix_space &&
            (p.empty() || p[0] != ' ')) {
          std::string spaced;
          spaced.reserve(p.size() + 1);
          spaced += ' ';
          spaced.append(p);
          owned.push_back(std::move(spaced));
          p = owned.back();
        }
        if (!step.regex) {
          next.push_back(p);
          continue;
        }
        split(p, step, next);
      }
      pieces.swap(next);
    }
  }

  static void split(std::string_view p, const PreTokStep& step,
                    std::vector<std::string_view>& out) {
    // Spans covering p: (start, end, matched).
    struct Span {
      size_t a, b;
      bool m;
    };
    std::vector<Span> spans;
    size_t last = 0;
    step.regex->for_each_match(p, [&](size_t a, size_t b) {
      if (a > last) spans.push_back({last, a, false});
      spans.push_back({a, b, true});
      last = b;
    });
    if (last < p.size()) spans.push_back({last, p.size(), false});
    if (step.invert)
      for (auto& s : spans) s.m = !s.m;
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        for (auto& s : spans) out.push_back(p.substr(s.a, s.b - s.a));
        break;
      case SplitBehavior::kRemoved:
        for (auto& s : spans)
          if (!s.m) out.push_back(p.substr(s.a, s.b - s.a));
        break;
      case SplitBehavior::kMergedWithPrevious: {
        std::vector<Span> merged;
        for (auto& s : spans) {
          if (s.m && !merged.empty())
            merged.back().b = s.b;
          else
            merged.push_back(s);
        }
        for (auto& s : merged) out.push_back(p.substr(s.a, s.b - s.a));
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        std::vector<Span> merged;
        bool carry = false;
        for (auto& s : spans) {
          if (carry)
            merged.back().b = s.b;
          else
            merged.push_back(s);
          carry = s.m;
        }
        for (auto& s : merged) out.push_back(p.substr(s.a, s.b - s.a));
        break;
      }
      case SplitBehavior::kContiguous: {
        std::vector<Span> merged;
        for (auto& s : spans) {
          if (!merged.empty() && merged.back().m == s.m)
            merged.back().b = s.b;
          else
            merged.push_back(s);
        }
        for (auto& s : merged) out.push_back(p.substr(s.a, s.b - s.a));
        break;
      }
    }
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges || word.size() == 1) {
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (word.size() <= 48) {
      WordCache& cache = word_cache(serial);
      auto hit = cache.map.find(word);
      if (hit != cache.map.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
      }
      size_t before = out.size();
      bpe_short(word, out);
      cache.map.emplace(std::string(word), std::vector<int32_t>(out.begin() + before, out.end()));
      return;
    }
    bpe_long(word, out);
  }

  // Short words (nearly all): repeatedly merge the best-ranked adjacent pair; the rank of each
  // pair is kept and only the two pairs next to a merge are looked up again.
  void bpe_short(std::string_view word, std::vector<int32_t>& out) const {
    const size_t n = word.size();
    int32_t ids[48], rank[48], merged[48];
    size_t m = n;
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id_of(static_cast<uint8_t>(word[i]));
    auto lookup = [&](size_t i) {
      auto it = merges.find(key(ids[i], ids[i + 1]));
      rank[i] = it == merges.end() ? INT32_MAX : it->second.rank;
      merged[i] = it == merges.end() ? -1 : it->second.new_id;
    };
    for (size_t i = 0; i + 1 < m; ++i) lookup(i);
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == INT32_MAX) break;
      ids[best] = merged[best];
      for (size_t i = best + 1; i + 1 < m; ++i) {
        ids[i] = ids[i + 1];
        rank[i] = rank[i + 1];
        merged[i] = merged[i + 1];
      }
      --m;
      if (best + 1 < m) lookup(best);
      if (best > 0) lookup(best - 1);
    }
    out.insert(out.end(), ids, ids + m);
  }

  void bpe_long(std::string_view word, std::vector<int32_t>& out) const {
    const size_t n = word.size();
    // Long words (whitespace or punctuation runs): a heap of candidate merges, lowest rank and
    // then leftmost first, as the Rust crate does.
    struct Sym {
      int32_t id;
      int prev, next;
      bool alive;
    };
    std::vector<Sym> sym(n);
    for (size_t i = 0; i < n; ++i)
      sym[i] = {byte_id_of(static_cast<uint8_t>(word[i])), static_cast<int>(i) - 1,
                i + 1 < n ? static_cast<int>(i) + 1 : -1, true};
    struct Cand {
      int32_t rank;
      int pos;
      int32_t new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int pos) {
      if (pos < 0 || sym[pos].next < 0) return;
      auto it = merges.find(key(sym[pos].id, sym[sym[pos].next].id));
      if (it != merges.end()) heap.push({it->second.rank, pos, it->second.new_id});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int>(i));
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      Sym& s = sym[c.pos];
      if (!s.alive || s.next < 0) continue;
      auto it = merges.find(key(s.id, sym[s.next].id));
      if (it == merges.end() || it->second.new_id != c.new_id) continue;
      int nx = s.next;
      s.id = c.new_id;
      sym[nx].alive = false;
      s.next = sym[nx].next;
      if (s.next >= 0) sym[s.next].prev = c.pos;
      push(s.prev);
      push(c.pos);
    }
    for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

  int32_t byte_id_of(uint8_t b) const {
    if (byte_id[b] < 0)
      throw Error(origin + ": the vocabulary has no token for byte 0x" +
                  std::string(1, "0123456789abcdef"[b >> 4]) + "0123456789abcdef"[b & 15]);
    return byte_id[b];
  }
};

namespace {

void parse_normalizer(TokenizerImpl& t, const json& n) {
  if (n.is_null()) return;
  std::string type = n.value("type", "");
  if (type == "NFC") {
    t.nfc = true;
  } else if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) parse_normalizer(t, s);
  } else {
    throw Error(t.origin + ": unsupported normalizer \"" + type +
                "\" (supported: none, NFC, Sequence of those)");
  }
}

void parse_pre_tokenizer(TokenizerImpl& t, const json& p) {
  if (p.is_null()) return;
  std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) parse_pre_tokenizer(t, s);
  } else if (type == "Split") {
    PreTokStep st;
    st.kind = PreTokStep::kSplit;
    const json& pat = p.at("pattern");
    if (pat.contains("Regex"))
      st.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), false,
                                         t.origin + ": Split pre-tokenizer");
    else if (pat.contains("String"))
      st.regex = std::make_shared<Regex>(pat["String"].get<std::string>(), true,
                                         t.origin + ": Split pre-tokenizer");
    else
      throw Error(t.origin + ": Split pre-tokenizer pattern needs Regex or String");
    std::string b = p.value("behavior", "Isolated");
    if (b == "Isolated")
      st.behavior = SplitBehavior::kIsolated;
    else if (b == "Removed")
      st.behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious")
      st.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      st.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous")
      st.behavior = SplitBehavior::kContiguous;
    else
      throw Error(t.origin + ": unsupported Split behavior \"" + b + "\"");
    st.invert = p.value("invert", false);
    t.pre.push_back(std::move(st));
  } else if (type == "ByteLevel") {
    PreTokStep st;
    st.kind = PreTokStep::kByteLevel;
    st.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true))
      st.regex = std::make_shared<Regex>(kGpt2Pattern, false, t.origin + ": ByteLevel");
    t.pre.push_back(std::move(st));
  } else {
    throw Error(t.origin + ": unsupported pre-tokenizer \"" + type +
                "\" (supported: Sequence, Split, ByteLevel)");
  }
}

void check_decoder(const TokenizerImpl& t, const json& d) {
  if (d.is_null()) return;
  std::string type = d.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& s : d.at("decoders")) check_decoder(t, s);
    return;
  }
  throw Error(t.origin + ": unsupported decoder \"" + type + "\" (supported: ByteLevel)");
}

// The special tokens a post-processor adds around a single sequence.
void parse_post_processor(TokenizerImpl& t, const json& p) {
  if (p.is_null()) return;
  std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("processors")) parse_post_processor(t, s);
  } else if (type == "TemplateProcessing") {
    bool after = false;
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        after = true;
      } else if (piece.contains("SpecialToken")) {
        std::string name = piece["SpecialToken"].at("id").get<std::string>();
        const json& st = p.at("special_tokens").at(name);
        for (const auto& id : st.at("ids")) (after ? t.suffix_ids : t.prefix_ids).push_back(id);
      }
    }
  } else if (type != "ByteLevel") {
    throw Error(t.origin + ": unsupported post-processor \"" + type +
                "\" (supported: ByteLevel, TemplateProcessing, Sequence)");
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(const json& tj, const json& cfg, const json& gen,
                               const std::string& origin) {
  auto t = std::make_shared<TokenizerImpl>();
  t->origin = origin;
  try {
    const json& model = tj.at("model");
    std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE")
      throw Error(origin + ": unsupported model type \"" + mtype + "\" (supported: BPE)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
        throw Error(origin + ": BPE " + k + " is not supported");
    }
    if (model.value("byte_fallback", false))
      throw Error(origin + ": BPE byte_fallback is not supported (byte-level BPE only)");
    if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"] > 0)
      throw Error(origin + ": BPE dropout is not supported");
    t->ignore_merges = model.value("ignore_merges", false);
    parse_normalizer(*t, tj.value("normalizer", json()));
    parse_pre_tokenizer(*t, tj.value("pre_tokenizer", json()));
    check_decoder(*t, tj.value("decoder", json()));

    int64_t max_id = -1;
    auto check_id = [&](const json& idj, const std::string& tok) {
      if (!idj.is_number_integer() || idj.get<int64_t>() < 0)
        throw Error(origin + ": token " + tok + " has an invalid id " + idj.dump());
      max_id = std::max<int64_t>(max_id, idj.get<int64_t>());
    };
    for (const auto& [tok, idj] : model.at("vocab").items()) check_id(idj, tok);
    for (const auto& a : tj.value("added_tokens", json::array()))
      check_id(a.at("id"), a.at("content").dump());
    // Ids index dense tables: refuse absurd ones rather than allocate gigabytes.
    size_t entries = model.at("vocab").size() + tj.value("added_tokens", json::array()).size();
    if (max_id >= static_cast<int64_t>(entries * 2 + 65536))
      throw Error(origin + ": token id " + std::to_string(max_id) + " is far beyond the " +
                  std::to_string(entries) + " tokens defined (ids must be dense)");
    t->size = static_cast<int32_t>(max_id + 1);
    t->id_text.assign(t->size, "");
    t->id_bytes.assign(t->size, "");
    t->special.assign(t->size, false);
    t->byte_id.fill(-1);
    t->vocab.reserve(model.at("vocab").size() * 2);
    for (const auto& [tok, idj] : model.at("vocab").items()) {
      int32_t id = idj;
      auto bytes = byte_level_decode(tok);
      std::string raw = bytes ? *bytes : tok;
      t->id_text[id] = tok;
      t->id_bytes[id] = raw;
      t->vocab.emplace(raw, id);
      if (raw.size() == 1) t->byte_id[static_cast<uint8_t>(raw[0])] = id;
    }
    // Merges name tokens as written in the vocabulary; look them up in that form (cheaper than
    // decoding both halves of every merge).
    SvMap<int32_t> by_text;
    by_text.reserve(t->id_text.size() * 2);
    for (int32_t id = 0; id < t->size; ++id)
      if (!t->id_text[id].empty()) by_text.emplace(t->id_text[id], id);
    int32_t rank = 0;
    t->merges.reserve(model.at("merges").size() * 2);
    std::string ab;
    for (const auto& m : model.at("merges")) {
      std::string_view a, b;
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        auto sp = s.find(' ');
        if (sp == std::string::npos) throw Error(origin + ": merge \"" + s + "\" has no space");
        a = std::string_view(s).substr(0, sp);
        b = std::string_view(s).substr(sp + 1);
      } else {
        a = m.at(0).get_ref<const std::string&>();
        b = m.at(1).get_ref<const std::string&>();
      }
      ab.assign(a);
      ab.append(b);
      auto ia = by_text.find(a), ib = by_text.find(b), ic = by_text.find(ab);
      if (ia == by_text.end() || ib == by_text.end() || ic == by_text.end())
        throw Error(origin + ": merge \"" + std::string(a) + " " + std::string(b) +
                    "\" uses a token not in the vocabulary");
      t->merges.emplace(TokenizerImpl::key(ia->second, ib->second),
                        TokenizerImpl::Merge{rank++, ic->second});
    }
    for (const auto& a : tj.value("added_tokens", json::array())) {
      AddedToken at{a.at("id"),
                    a.at("content"),
                    a.value("lstrip", false),
                    a.value("rstrip", false),
                    a.value("single_word", false),
                    a.value("normalized", false),
                    a.value("special", false)};
      t->id_text[at.id] = at.content;
      auto bytes = byte_level_decode(at.content);
      t->id_bytes[at.id] = bytes ? *bytes : at.content;
      t->special[at.id] = at.special;
      t->added.push_back(std::move(at));
    }
    t->raw_matcher.tokens = t->norm_matcher.tokens = &t->added;
    for (size_t i = 0; i < t->added.size(); ++i) {
      // Special tokens are never normalized (the Rust crate forces normalized=false on them).
      bool norm = t->added[i].normalized && !t->added[i].special;
      (norm ? t->norm_matcher : t->raw_matcher).add(i);
    }
    parse_post_processor(*t, tj.value("post_processor", json()));
  } catch (const json::exception& e) {
    throw Error(origin + ": unexpected structure: " + e.what());
  }

  Tokenizer tok(t);
  if (cfg.is_object()) {
    t->bos_tok = token_string(cfg.value("bos_token", json()));
    t->eos_tok = token_string(cfg.value("eos_token", json()));
    if (!t->bos_tok.empty()) t->bos = tok.token_to_id(t->bos_tok);
    const json& ct = cfg.value("chat_template", json());
    if (ct.is_string()) {
      t->chat_template = ct;
    } else if (ct.is_array()) {
      for (const auto& e : ct)
        if (e.value("name", "") == "default") t->chat_template = e.value("template", "");
    }
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      // The config decides, as transformers does when it rebuilds the post-processor.
      t->add_bos = cfg["add_bos_token"];
      t->prefix_ids.clear();
      t->suffix_ids.clear();
      if (t->add_bos && t->bos) t->prefix_ids.push_back(*t->bos);
      if (cfg.value("add_eos_token", false) && !t->eos_tok.empty())
        if (auto e = tok.token_to_id(t->eos_tok)) t->suffix_ids.push_back(*e);
    }
  }
  if (!t->add_bos) t->add_bos = !t->prefix_ids.empty() && t->bos && t->prefix_ids[0] == *t->bos;
  if (gen.is_object() && gen.contains("eos_token_id")) {
    const json& e = gen["eos_token_id"];
    if (e.is_number_integer())
      t->eos.push_back(e);
    else if (e.is_array())
      for (const auto& x : e) t->eos.push_back(x);
  }
  if (t->eos.empty() && !t->eos_tok.empty())
    if (auto e = tok.token_to_id(t->eos_tok)) t->eos.push_back(*e);
  return tok;
}

Tokenizer Tokenizer::load(const std::string& dir) {
  std::string tj_path = dir + "/tokenizer.json";
  if (!file_exists(tj_path)) throw Error("no tokenizer.json in " + dir);
  json tj = parse_json_file(tj_path);
  json cfg, gen;
  if (file_exists(dir + "/tokenizer_config.json"))
    cfg = parse_json_file(dir + "/tokenizer_config.json");
  if (file_exists(dir + "/generation_config.json"))
    gen = parse_json_file(dir + "/generation_config.json");
  // A chat_template.jinja file wins over the config's template (as in transformers).
  if (file_exists(dir + "/chat_template.jinja")) {
    if (!cfg.is_object()) cfg = json::object();
    cfg["chat_template"] = read_file(dir + "/chat_template.jinja");
  }
  return from_json(tj, cfg, gen, tj_path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  require_utf8(text, "text to tokenize");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids.insert(ids.end(), t.prefix_ids.begin(), t.prefix_ids.end());
  std::vector<Segment> raw, norm;
  t.split_added(text, t.raw_matcher, raw);
  std::deque<std::string> owned;
  std::vector<std::string_view> pieces;
  for (const Segment& s : raw) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    std::string_view seg = s.text;
    if (t.nfc) {
      owned.push_back(nfc(seg));
      seg = owned.back();
    }
    norm.clear();
    t.split_added(seg, t.norm_matcher, norm);
    for (const Segment& n : norm) {
      if (n.id >= 0) {
        ids.push_back(n.id);
        continue;
      }
      t.pre_tokenize(n.text, pieces, owned);
      for (std::string_view p : pieces) t.bpe(p, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  return ids;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->size)
    throw Error("token id " + std::to_string(id) + " is out of range (vocabulary size " +
                std::to_string(impl_->size) + ")");
  return impl_->id_bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special_tokens && impl_->special[id]) continue;
    bytes += b;
  }
  return utf8_lossy(bytes);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->size;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto bytes = byte_level_decode(token);
  auto it = impl_->vocab.find(bytes ? *bytes : std::string(token));
  if (it == impl_->vocab.end() || impl_->id_text[it->second] != token) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->size) return "";
  return impl_->id_text[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->size && impl_->special[id];
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::vector<int32_t> Tokenizer::eos_ids() const {
  return impl_->eos;
}
std::string Tokenizer::bos_token() const {
  return impl_->bos_tok;
}
std::string Tokenizer::eos_token() const {
  return impl_->eos_tok;
}
const std::string& Tokenizer::chat_template() const {
  return chat_template_override_ ? *chat_template_override_ : impl_->chat_template;
}
bool Tokenizer::add_bos_token() const {
  return impl_->add_bos;
}

std::vector<std::pair<int32_t, std::string>> Tokenizer::added_tokens() const {
  std::vector<std::pair<int32_t, std::string>> r;
  for (const auto& a : impl_->added) r.emplace_back(a.id, a.content);
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace sieve::text
