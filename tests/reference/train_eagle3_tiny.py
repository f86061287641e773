#!/usr/bin/env python3
"""Train an EAGLE3 draft for Sieve's bundled model (models/minimax-m3-tiny) and export it in the
published Hugging Face layout that vLLM, SGLang and Sieve read (src/spec/eagle3.h).

Runs on the GPU machine (PyTorch, transformers 5.17, tokenizers, safetensors; see README.md in this
folder). The target is the bundled checkpoint, run by transformers' own MiniMax-M3 classes through
train_tiny_m3.py's loader (spec-rule block selection, as Sieve selects). Input: the corpus of
extract_corpus.py (.corpus/). Output (--out): config.json + model.safetensors (the draft, BF16,
~5.5 MB: no embed_tokens, the target's embedding is shared) and eval.json (held-out acceptance).

The draft (one Llama-style decoder layer, EAGLE3, Li et al. 2025):
  g      = fc(concat(aux hidden states))       aux = the residual stream entering layers AUX_LAYERS
  x      = [rmsnorm(embed(token)) | rmsnorm(g)]  (2 H wide)
  h      = g + o_proj(attention(q, k, v of x; RoPE over the whole head))
  out    = h + mlp(rmsnorm(h))                  (SiLU MLP); logits = lm_head(rmsnorm(out))
The row at position p reads the token at p + 1 and predicts the one at p + 2. Training-time test
(EAGLE3): step 0 takes g from the target's aux states; step j > 0 takes g from step j - 1's
output at p - 1 and attends to step 0's keys up to p - j plus its own chain of keys, as the draft
does when it proposes several tokens. Loss: cross-entropy against the target's distribution of
the same next token (distillation), steps weighted 0.8^j.

Held-out evaluation (what serving sees): the target generates greedy continuations of held-out
prompts; along them the draft proposes K tokens per round exactly as Sieve's engine does (first
draft from the catch-up row, then K - 1 one-row passes fed its own output) and the mean accepted
length (kept drafts + 1) is reported per K.

  python3 tests/reference/train_eagle3_tiny.py --out OUT          # GPU, ~3.5 minutes
  python3 tests/reference/train_eagle3_tiny.py --smoke --out /tmp/d   # any machine, seconds: CPU,
      and a random stand-in target when transformers or the corpus is missing
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Draft shape. Heads of 128 (Sieve's CUDA attention); the target's hidden size; full vocabulary
# (6,144 ids: no pruning needed, d2t all zero).
AUX_LAYERS = (1, 3, 4)  # low / mid / high of the 6-layer target (EAGLE3 picks 2, n/2, n-3 for deep models)
HEADS, KV_HEADS, HEAD_DIM = 2, 2, 128
INTER = 768
ROPE_THETA = 10000.0
EPS = 1e-6


# ----------------------------------------------------------------------------------------------
# The target: aux hidden states and logits of a batch of token windows
# ----------------------------------------------------------------------------------------------
class Target:
    """forward(x) -> (aux [A][B, S, H] fp32, logits [B, S, V] fp32); embed [V, H]; head/final
    norm for initialising the draft."""

    def __init__(self, model_dir, device, smoke):
        self.device = device
        self.standin = False
        try:
            if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
                raise FileNotFoundError(model_dir)
            sys.path.insert(0, HERE)
            import train_tiny_m3 as T  # transformers' MiniMax-M3 classes + the published-layout loader

            tensors = load_file(os.path.join(model_dir, "model.safetensors"))
            model = T.build_model("sdpa").float().to(device)
            model.load_state_dict(T.from_published(tensors, model), strict=True)
            T.set_mode(model, "spec")  # Sieve's selection rule (same sets as transformers')
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
            self.model = model
            self.n_layers = T.N_LAYERS
            self.vocab, self.hidden = T.VOCAB, T.HIDDEN
            self.embed = model.model.embed_tokens.weight.detach()
            self.head = model.lm_head.weight.detach()
            # Gemma norm (1 + w) -> Llama norm weight.
            self.final_norm = (1.0 + model.model.norm.weight.detach().float())
            self.bos, self.eos = T.BOS, T.EOS
        except Exception as e:  # noqa: BLE001 - the smoke run works without transformers
            if not smoke:
                raise
            log("stand-in target (smoke):", repr(e)[:160])
            self.standin = True
            g = torch.Generator().manual_seed(0)
            self.n_layers, self.vocab, self.hidden = 6, 512, 256
            self.embed = (torch.randn(self.vocab, self.hidden, generator=g) * 0.5).to(device)
            self.layers = [(torch.randn(self.hidden, self.hidden, generator=g) / math.sqrt(self.hidden)).to(device)
                           for _ in range(self.n_layers)]
            self.head = (torch.randn(self.vocab, self.hidden, generator=g) / math.sqrt(self.hidden) * 4).to(device)
            self.final_norm = torch.ones(self.hidden, device=device)
            self.bos, self.eos = 0, 2

    @torch.no_grad()
    def forward(self, x):
        if self.standin:
            h = self.embed[x]
            states = []
            for i, w in enumerate(self.layers):
                states.append(h)
                # causal mixing: a running mean, so the state depends on the prefix
                mix = torch.cumsum(h, 1) / torch.arange(1, h.shape[1] + 1, device=h.device).view(1, -1, 1)
                h = h + torch.tanh(mix @ w)
            logits = F.rms_norm(h, (self.hidden,), eps=EPS) @ self.head.t() if hasattr(F, "rms_norm") else \
                (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)) @ self.head.t()
            return [states[i].float() for i in AUX_LAYERS], logits.float()
        # The residual stream entering each aux layer, read by pre-hooks (the definition itself,
        # whatever output_hidden_states returns in a given transformers version).
        got = {}

        def grab(i):
            def hook(mod, args, kwargs):
                got[i] = (args[0] if args else kwargs["hidden_states"]).float()
            return hook

        hooks = [self.model.model.layers[i].register_forward_pre_hook(grab(i), with_kwargs=True) for i in AUX_LAYERS]
        try:
            ctx = torch.autocast("cuda", dtype=torch.bfloat16) if x.is_cuda else torch.autocast("cpu", enabled=False)
            with ctx:
                out = self.model(input_ids=x, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        return [got[i] for i in AUX_LAYERS], out.logits.float()


# ----------------------------------------------------------------------------------------------
# The draft
# ----------------------------------------------------------------------------------------------
def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS) * w


def attend(q, k, v, causal):
    """softmax(q k^T / sqrt(D)) v over the key axis (causal: key j <= query i, queries last)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        Sq, Sk = q.shape[-2], k.shape[-2]
        qi = torch.arange(Sk - Sq, Sk, device=q.device).view(-1, 1)
        s = s.masked_fill(torch.arange(Sk, device=q.device).view(1, -1) > qi, float("-inf"))
    return torch.softmax(s.float(), -1).to(v.dtype) @ v


def rope_tables(n, device):
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    ang = torch.arange(n, device=device).float()[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope(x, cos, sin):  # x [B, h, S, D]; NeoX pairs (d, d + D/2)
    a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class Draft(torch.nn.Module):
    def __init__(self, target):
        super().__init__()
        H, A = target.hidden, len(AUX_LAYERS)
        self.H = H
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.fc = lin(A * H, H)
        self.q_proj, self.k_proj, self.v_proj = lin(2 * H, HEADS * HEAD_DIM), lin(2 * H, KV_HEADS * HEAD_DIM), lin(2 * H, KV_HEADS * HEAD_DIM)
        self.o_proj = lin(HEADS * HEAD_DIM, H)
        self.gate_proj, self.up_proj, self.down_proj = lin(H, INTER), lin(H, INTER), lin(INTER, H)
        self.input_layernorm = torch.nn.Parameter(torch.ones(H))
        self.hidden_norm = torch.nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(H))
        self.norm = torch.nn.Parameter(target.final_norm.clone().float())
        self.lm_head = lin(H, target.vocab)
        with torch.no_grad():
            self.lm_head.weight.copy_(target.head.float())  # start from the target's head
            self.fc.weight.mul_(0.5)
        self.register_buffer("embed", target.embed.float().clone(), persistent=False)

    def qkv(self, tokens, g, cos, sin):
        """x = [norm(embed(token)) | norm(g)] -> roped q [B, h, S, D], k, v [B, kvh, S, D]."""
        B, S = tokens.shape
        x = torch.cat([rmsnorm(self.embed[tokens], self.input_layernorm), rmsnorm(g, self.hidden_norm)], -1)
        q = self.q_proj(x).view(B, S, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(B, S, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(B, S, KV_HEADS, HEAD_DIM).transpose(1, 2)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def finish(self, g, attn):
        """attn [B, S, h*D] -> (pre-norm output, logits)."""
        h = g + self.o_proj(attn)
        xn = rmsnorm(h, self.post_attention_layernorm)
        out = h + self.down_proj(F.silu(self.gate_proj(xn)) * self.up_proj(xn))
        return out, self.lm_head(rmsnorm(out, self.norm))

    def ttt(self, tokens, aux, steps):
        """Training-time test over [B, S] (tokens[:, p] is the token after position p). Returns the
        logits of every step [steps][B, S, V]; row p of step j is valid for p >= j."""
        B, S = tokens.shape
        cos, sin = rope_tables(S, tokens.device)
        rep = HEADS // KV_HEADS
        scale = 1.0 / math.sqrt(HEAD_DIM)
        g = self.fc(torch.cat(aux, -1))
        keys, vals, outs = [], [], []
        pos = torch.arange(S, device=tokens.device)
        for j in range(steps):
            q, k, v = self.qkv(tokens, g, cos, sin)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            keys.append(k)
            vals.append(v)
            # step-0 keys at positions <= p - j
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(pos.view(1, -1) > (pos.view(-1, 1) - j), float("-inf"))
            parts, vparts = [s0], []
            # the chain: step l's key at position p - j + l (l = 1..j)
            for l in range(1, j + 1):
                sh = j - l
                kl = F.pad(keys[l], (0, 0, sh, 0))[:, :, :S]  # kl[p] = keys[l][p - sh]
                vl = F.pad(vals[l], (0, 0, sh, 0))[:, :, :S]
                parts.append(((q * kl).sum(-1, keepdim=True)) * scale)
                vparts.append(vl)
            s = torch.cat(parts, -1)
            # rows p < j have no valid step-0 key: keep their softmax finite (their loss is masked)
            s = torch.where(torch.isinf(s).all(-1, keepdim=True), torch.zeros_like(s), s)
            p = torch.softmax(s.float(), -1).to(q.dtype)
            o = p[..., :S] @ vals[0]
            for l, vl in enumerate(vparts):
                o = o + p[..., S + l : S + l + 1] * vl
            out, logits = self.finish(g, o.transpose(1, 2).reshape(B, S, HEADS * HEAD_DIM))
            outs.append(logits)
            g = F.pad(out, (0, 0, 1, 0))[:, :S]  # next step's g at p = this step's output at p - 1
        return outs

    # -- one sequence, as the engine runs it (evaluation) ------------------------------------
    def catch_up(self, tokens, aux):
        """Step 0 over a whole sequence [1, S]: keys/values, outputs and logits of every row."""
        S = tokens.shape[1]
        cos, sin = rope_tables(S + 64, tokens.device)
        g = self.fc(torch.cat(aux, -1))
        q, k, v = self.qkv(tokens, g, cos[:S], sin[:S])
        rep = HEADS // KV_HEADS
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = attend(q, k, v, True)
        out, logits = self.finish(g, o.transpose(1, 2).reshape(1, S, HEADS * HEAD_DIM))
        return k, v, out, logits, (cos, sin)

    def step(self, token, g, pos, k0, v0, chain, tables):
        """One row at `pos` reading the catch-up's keys k0/v0 (positions before this round) plus the
        chain of this round's rows (appended to). Returns (output, logits)."""
        cos, sin = tables
        q, k, v = self.qkv(token.view(1, 1), g.view(1, 1, -1), cos[pos : pos + 1], sin[pos : pos + 1])
        rep = HEADS // KV_HEADS
        chain.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        K = torch.cat([k0] + [c[0] for c in chain], 2)
        V = torch.cat([v0] + [c[1] for c in chain], 2)
        o = attend(q, K, V, False)
        out, logits = self.finish(g.view(1, 1, -1), o.transpose(1, 2).reshape(1, 1, HEADS * HEAD_DIM))
        return out[0, 0], logits[0, 0]


# ----------------------------------------------------------------------------------------------
# Export (the published layout) and evaluation
# ----------------------------------------------------------------------------------------------
ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL"}


def save_file(tensors, path, metadata=None):
    """A .safetensors file (8-byte little-endian header size, JSON header, raw little-endian data),
    written here so that the smoke run needs nothing but torch."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t.to(torch.uint8) if t.dtype == torch.bool else t).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_file(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    base, out = 8 + n, {}
    back = {"BF16": torch.int16, "F32": torch.float32, "I64": torch.int64, "BOOL": torch.uint8}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a : base + b]), dtype=back[e["dtype"]]).reshape(e["shape"])
        out[name] = t.view(torch.bfloat16) if e["dtype"] == "BF16" else t.bool() if e["dtype"] == "BOOL" else t
    return out


def export(draft, target, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous().cpu()
    L = "midlayer."
    t = {
        "fc.weight": bf(draft.fc.weight),
        L + "self_attn.q_proj.weight": bf(draft.q_proj.weight),
        L + "self_attn.k_proj.weight": bf(draft.k_proj.weight),
        L + "self_attn.v_proj.weight": bf(draft.v_proj.weight),
        L + "self_attn.o_proj.weight": bf(draft.o_proj.weight),
        L + "mlp.gate_proj.weight": bf(draft.gate_proj.weight),
        L + "mlp.up_proj.weight": bf(draft.up_proj.weight),
        L + "mlp.down_proj.weight": bf(draft.down_proj.weight),
        L + "input_layernorm.weight": bf(draft.input_layernorm),
        L + "hidden_norm.weight": bf(draft.hidden_norm),
        L + "post_attention_layernorm.weight": bf(draft.post_attention_layernorm),
        "norm.weight": bf(draft.norm),
        "lm_head.weight": bf(draft.lm_head.weight),
        "d2t": torch.zeros(target.vocab, dtype=torch.int64),
        "t2d": torch.ones(target.vocab, dtype=torch.bool),
    }
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "max_position_embeddings": 2048,
        "vocab_size": target.vocab,
        "draft_vocab_size": target.vocab,
        "target_hidden_size": target.hidden,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS), "use_aux_hidden_state": True},
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    # For `sieve serve --speculative-config=DIR/speculative.json` (model: this folder).
    with open(os.path.join(out_dir, "speculative.json"), "w") as f:
        json.dump({"method": "eagle3", "model": ".", "num_speculative_tokens": 3}, f)
        f.write("\n")
    return os.path.getsize(os.path.join(out_dir, "model.safetensors"))


@torch.no_grad()
def greedy_continuations(target, prompts, n):
    x = prompts.clone()
    for _ in range(n):
        _, logits = target.forward(x)
        x = torch.cat([x, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return x


@torch.no_grad()
def acceptance(draft, target, prompts, n_new, ks):
    """Mean accepted length per round (kept drafts + 1) along the target's greedy continuations,
    for each K in ks; drafts made as Sieve's engine makes them."""
    y = greedy_continuations(target, prompts, n_new)
    aux, logits = target.forward(y)
    start = prompts.shape[1]
    res = {}
    for K in ks:
        rounds = kept = 0
        per_pos = [0] * K
        for b in range(y.shape[0]):
            seq = y[b : b + 1]
            want = logits[b].argmax(-1)  # the target's greedy token after each position
            tok_next = torch.cat([seq[0, 1:], want[-1:]])  # token at p + 1 (the last: the target's own)
            k0, v0, out0, lg0, tables = draft.catch_up(tok_next.view(1, -1), [a[b : b + 1] for a in aux])
            c = start  # y[c] is the newest token; positions < c are computed
            while c + K < y.shape[1]:
                d = [int(lg0[0, c - 1].argmax())]
                g, chain, tok = out0[0, c - 1], [], d[0]
                for j in range(1, K):
                    g, lg = draft.step(torch.tensor(tok, device=y.device), g, c + j - 1, k0[:, :, :c], v0[:, :, :c],
                                       chain, tables)
                    tok = int(lg.argmax())
                    d.append(tok)
                a = 0
                while a < K and d[a] == int(want[c + a]):  # want[p] is the target's token at p + 1
                    per_pos[a] += 1
                    a += 1
                rounds += 1
                kept += a
                c += a + 1
        res[str(K)] = {"mean_acceptance_length": 1 + kept / max(rounds, 1), "rounds": rounds,
                       "per_position_rate": [p / max(rounds, 1) for p in per_pos]}
    return res


@torch.no_grad()
def self_check(draft, target, stream, device):
    """The training-time test's masks give what the engine's passes compute: step 0 equals the
    catch-up pass, and steps 1, 2 at a row equal one-row passes chained from the row before."""
    x = stream[:41].view(1, -1).to(device)
    aux, _ = target.forward(x[:, :-1])
    tok = x[:, 1:]
    outs = draft.ttt(tok, aux, 3)
    k0, v0, out0, lg0, tables = draft.catch_up(tok, aux)
    c, chain = 20, []
    g, l1 = draft.step(tok[0, c], out0[0, c - 1], c, k0[:, :, :c], v0[:, :, :c], chain, tables)
    _, l2 = draft.step(tok[0, c + 1], g, c + 1, k0[:, :, :c], v0[:, :, :c], chain, tables)
    scale = float(lg0.abs().max())
    diffs = [float((outs[0] - lg0).abs().max()), float((outs[1][0, c] - l1).abs().max()),
             float((outs[2][0, c + 1] - l2).abs().max())]
    log("self-check (training-time test vs the engine's passes), max |logit diff|:", diffs, "of", round(scale, 2))
    assert max(diffs) < 1e-3 * max(scale, 1.0), diffs


# ----------------------------------------------------------------------------------------------
def token_streams(target, corpus, smoke, device):
    model_dir = os.path.join(ROOT, "models", "minimax-m3-tiny")
    paths = [os.path.join(corpus, f) for f in ("train.jsonl", "heldout.jsonl")]
    if target.standin or not all(os.path.exists(p) for p in paths):
        if not smoke:
            raise SystemExit(f"corpus not found under {corpus}: run tests/reference/extract_corpus.py first")
        log("synthetic corpus (smoke)")
        g = torch.Generator().manual_seed(1)
        base = torch.randint(4, target.vocab, (64,), generator=g)
        mk = lambda n: torch.cat([base[torch.randint(0, 56, (1,), generator=g).item():][:8] for _ in range(n // 8)])
        return mk(40000), mk(8000)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f if line.strip()]
        ids = []
        for e in tok.encode_batch(docs, add_special_tokens=False):
            ids += [target.bos] + e.ids
        out.append(torch.tensor(ids, dtype=torch.long))
    return out[0], out[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "minimax-m3-tiny"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, ".corpus"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--train-s", type=float, default=140)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--ttt", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-prompts", type=int, default=48)
    ap.add_argument("--eval-new", type=int, default=96)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # small tensors: threads only contend
    if args.smoke:
        given_s = "--train-s" in sys.argv
        args.train_s, args.batch, args.seq, args.eval_prompts, args.eval_new = 6, 4, 64, 3, 12
        if given_s:
            args.train_s = float(sys.argv[sys.argv.index("--train-s") + 1])
    torch.manual_seed(args.seed)
    log("torch", torch.__version__, "device", device, torch.cuda.get_device_name(0) if device == "cuda" else "")

    target = Target(args.model, device, args.smoke)
    train, held = token_streams(target, args.corpus, args.smoke, device)
    log(f"train tokens {train.numel()}, held-out tokens {held.numel()}; aux layers {AUX_LAYERS}")
    draft = Draft(target).to(device)
    self_check(draft, target, held, device)
    params = [p for p in draft.parameters() if p.requires_grad]
    log(f"draft: {sum(p.numel() for p in params) / 1e6:.2f} M parameters")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(args.seed)
    hist, step, t_start = [], 0, time.time()
    est_steps = None
    while True:
        el = time.time() - t_start
        if el > args.train_s:
            break
        # cosine schedule over the time budget (the step count is not known in advance)
        frac = min(1.0, el / args.train_s)
        lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))) * min(1.0, (step + 1) / 50)
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, train.numel() - args.seq - 2, (args.batch,), generator=g)
        x = torch.stack([train[s : s + args.seq + 1] for s in starts.tolist()]).to(device)
        aux, logits = target.forward(x[:, :-1])
        tokens = x[:, 1:]  # token after each position
        # row p predicts the token at p + 2: target distribution of logits[p + 1]
        tgt = torch.softmax(logits[:, 1:], -1)
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
        with ctx:
            outs = draft.ttt(tokens, aux, args.ttt)
        loss, accs = 0.0, []
        S = args.seq
        for j, lg in enumerate(outs):
            lp = torch.log_softmax(lg[:, j : S - 1].float(), -1)
            t = tgt[:, j:]
            loss = loss + (0.8 ** j) * -(t * lp).sum(-1).mean()
            accs.append(float((lg[:, j : S - 1].argmax(-1) == t.argmax(-1)).float().mean()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % (10 if args.smoke else 100) == 0:
            log(f"step {step} lr {lr:.2e} loss {float(loss):.4f} top-1 agreement per step {[round(a, 3) for a in accs]}")
            hist.append({"step": step, "loss": float(loss), "agree": accs})
        step += 1
    log(f"trained {step} steps in {time.time() - t_start:.0f} s")

    draft.eval()
    size = export(draft, target, args.out)
    log(f"exported to {args.out}: model.safetensors {size / 1e6:.2f} MB")
    assert size <= 8e6, "draft larger than 8 MB"
    # Held-out acceptance, from the exported BF16 weights (what Sieve loads).
    w = load_file(os.path.join(args.out, "model.safetensors"))
    with torch.no_grad():
        for name, mod in (("fc", draft.fc), ("midlayer.self_attn.q_proj", draft.q_proj), ("midlayer.self_attn.k_proj", draft.k_proj),
                          ("midlayer.self_attn.v_proj", draft.v_proj), ("midlayer.self_attn.o_proj", draft.o_proj),
                          ("midlayer.mlp.gate_proj", draft.gate_proj), ("midlayer.mlp.up_proj", draft.up_proj),
                          ("midlayer.mlp.down_proj", draft.down_proj), ("lm_head", draft.lm_head)):
            mod.weight.copy_(w[name + ".weight"].float())
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            getattr(draft, name).copy_(w["midlayer." + name + ".weight"].float())
        draft.norm.copy_(w["norm.weight"].float())
    starts = torch.linspace(0, held.numel() - 300, args.eval_prompts).long().tolist()
    plen = 64 if args.smoke else 256
    prompts = torch.stack([held[s : s + plen] for s in starts]).to(device)
    t_eval = time.time()
    res = acceptance(draft, target, prompts, args.eval_new, [1, 2, 3, 4])
    log(f"held-out acceptance ({args.eval_prompts} prompts of {plen} tokens, {args.eval_new} greedy tokens each; "
        f"{time.time() - t_eval:.0f} s):")
    for k, r in res.items():
        log(f"  K={k}: mean acceptance length {r['mean_acceptance_length']:.3f}, per position {[round(x, 3) for x in r['per_position_rate']]}")
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump({"aux_layers": AUX_LAYERS, "steps": step, "train_s": args.train_s, "args": vars(args),
                   "standin_target": target.standin, "heldout_acceptance": res, "history": hist,
                   "torch": torch.__version__}, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
