#!/usr/bin/env python3
"""Train Sieve's bundled tiny MiniMax-M3 model and write its golden files.

Runs on the GPU machine (PyTorch, transformers 5.17, tokenizers, safetensors); see README.md in
this folder for how it was run. Input: the corpus written by extract_corpus.py (.corpus/). Output
(--out): model/ (the checkpoint in the published MiniMax-M3 layout), golden/ (JSON files) and a
run log. Everything the model computes comes from transformers' own MiniMax-M3 classes
(transformers.models.minimax_m3_vl); this file only adds the training loop, the indexer
distillation loss, an optional spec-semantics block selection (see docs/transformers-m3.md) and
the conversion to the published tensor names.

Steps:
  1. byte-level BPE tokenizer (tokenizers), MiniMax chat markers as added tokens;
  2. dense phase: every block selected (index_topk_blocks raised above the block count), LM loss;
  3. indexer warm-up: everything frozen but the indexers, KL(attention mass per block || softmax of
     the indexer's block scores) as published for lightning indexers (DeepSeek V3.2 DSA);
  4. sparse phase: top-k block selection on, LM loss + the same KL loss for the indexers;
  5. save BF16 (router gate and routing bias F32) under the published names, reload that file into
     a fresh fp32 model, and write goldens (fp32, eager attention) and held-out perplexity.
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time
import types

import torch
import torch.nn.functional as F

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------
# Model shape (written to config.json; see README.md)
# ----------------------------------------------------------------------------------------------
VOCAB = 6144
HIDDEN = 256
N_LAYERS = 6
N_DENSE = 1  # layers 0..N_DENSE-1: dense attention + dense MLP; the rest: sparse attention + MoE
N_HEADS = 4
N_KV = 2
HEAD_DIM = 128
ROTARY_DIM = 64
DENSE_INTER = 512
EXPERT_INTER = 128
SHARED_INTER = 128
N_EXPERTS = 8
TOP_EXPERTS = 2
INDEX_HEADS = 2
INDEX_DIM = 128
BLOCK = 128
TOPK_BLOCKS = 4
LOCAL_BLOCKS = 1
CONTEXT = 2048
ROPE_THETA = 5_000_000.0
EPS = 1e-6

SPECIAL = ["]~!b[", "]~b]", "[e~[", "]!p~["]  # bos, role marker, eos (end of turn), pad
ADDED = ["<think>", "</think>", "]<]minimax[>[", "<tool_call>", "</tool_call>"]
BOS, ROLE, EOS, PAD = 0, 1, 2, 3
# GPT-2 / Qwen2-style pre-tokenizer split (single digits).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPARSE_LAYERS = list(range(N_DENSE, N_LAYERS))


def sparse_attention_config():
    freq = [0] * N_DENSE + [1] * (N_LAYERS - N_DENSE)
    return {
        "use_sparse_attention": True,
        "sparse_attention_freq": freq,
        "sparse_block_size": BLOCK,
        "sparse_num_index_heads": INDEX_HEADS,
        "sparse_index_dim": INDEX_DIM,
        "sparse_topk_blocks": TOPK_BLOCKS,
        "sparse_init_block": 0,
        "sparse_local_block": LOCAL_BLOCKS,
        "sparse_score_type": "max",
        "sparse_disable_index_value": list(freq),
    }


def published_text_config():
    """text_config as the published MiniMax-M3 config.json spells it (spec section 1)."""
    freq = [0] * N_DENSE + [1] * (N_LAYERS - N_DENSE)
    return {
        "architectures": ["MiniMaxM3SparseForCausalLM"],
        "model_type": "minimax_m3_vl_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": EPS,
        "use_gemma_norm": True,
        "use_qk_norm": True,
        "qk_norm_type": "per_head",
        "attention_output_gate": False,
        "rope_theta": ROPE_THETA,
        "rotary_dim": ROTARY_DIM,
        "partial_rotary_factor": ROTARY_DIM / HEAD_DIM,
        "hidden_act": "swigluoai",
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "dense_intermediate_size": DENSE_INTER,
        "intermediate_size": EXPERT_INTER,
        "shared_intermediate_size": SHARED_INTER,
        "num_local_experts": N_EXPERTS,
        "num_experts_per_tok": TOP_EXPERTS,
        "n_shared_experts": 1,
        "scoring_func": "sigmoid",
        "use_routing_bias": True,
        "routed_scaling_factor": 2.0,
        "moe_layer_freq": freq,
        "tie_word_embeddings": False,
        "num_mtp_modules": 0,
        "num_nextn_predict_layers": 0,
        "sparse_attention_config": sparse_attention_config(),
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": "bfloat16",
    }


# ----------------------------------------------------------------------------------------------
# Corpus and tokenizer
# ----------------------------------------------------------------------------------------------
def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_documents(docs, rng, template, fraction):
    """Short chat transcripts built from training paragraphs, so the model learns the §7 format
    and to end an answer with [e~[. The user quotes the start of a paragraph; the ai continues it."""
    out = []
    for d in docs:
        for para in d["text"].split("\n"):
            para = para.strip()
            if len(para) < 300 or rng.random() > fraction:
                continue
            m = re.search(r"[.!?;]\s", para[60:300])
            cut = 60 + m.end() if m else 160
            head, rest = para[:cut].strip(), para[cut:].strip()
            if not rest:
                continue
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": "You are a helpful assistant."})
            ask = rng.choice(["Continue this passage:\n", "Please continue:\n", "What comes next?\n", ""])
            msgs += [{"role": "user", "content": ask + head}, {"role": "assistant", "content": rest}]
            out.append(template.render(messages=msgs, add_generation_prompt=False))
    return out


def jinja_template(src):
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    return env.from_string(src)


def train_tokenizer(texts, outdir, template_src):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(ADDED),
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    n = tok.get_vocab_size(with_added_tokens=True)
    assert n == VOCAB, f"tokenizer has {n} tokens, expected {VOCAB}"
    for i, t in enumerate(SPECIAL):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    added = {}
    for t in SPECIAL + ADDED:
        added[str(tok.token_to_id(t))] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL[BOS],
        "eos_token": SPECIAL[EOS],
        "pad_token": SPECIAL[PAD],
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONTEXT,
        "added_tokens_decoder": added,
        "chat_template": template_src,
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(outdir, "chat_template.jinja"), "w") as f:
        f.write(template_src)
    return tok


# ----------------------------------------------------------------------------------------------
# Model construction through transformers' classes
# ----------------------------------------------------------------------------------------------
def tf_modules():
    from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as C
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as M

    return C, M


def build_text_config():
    C, _ = tf_modules()
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=EXPERT_INTER,
        dense_intermediate_size=DENSE_INTER,
        shared_intermediate_size=SHARED_INTER,
        n_shared_experts=1,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV,
        head_dim=HEAD_DIM,
        hidden_act="silu",  # unused by the M3 MLPs (they hard-code SwiGLU-OAI); "swigluoai" is not in ACT2FN
        max_position_embeddings=CONTEXT,
        rms_norm_eps=EPS,
        tie_word_embeddings=False,
        num_experts_per_tok=TOP_EXPERTS,
        num_local_experts=N_EXPERTS,
        routed_scaling_factor=2.0,
        rotary_dim=ROTARY_DIM,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        use_routing_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": ROTARY_DIM / HEAD_DIM},
        sparse_attention_config=sparse_attention_config(),
        moe_layer_freq=[0] * N_DENSE + [1] * (N_LAYERS - N_DENSE),
        layer_types=["full_attention"] * N_DENSE + ["minimax_m3_sparse"] * (N_LAYERS - N_DENSE),
        mlp_layer_types=["dense"] * N_DENSE + ["sparse"] * (N_LAYERS - N_DENSE),
        index_n_heads=INDEX_HEADS,
        index_head_dim=INDEX_DIM,
        index_block_size=BLOCK,
        index_topk_blocks=TOPK_BLOCKS,
        index_local_blocks=LOCAL_BLOCKS,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        use_cache=False,
    )
    optional = {"use_routing_bias", "mlp_layer_types", "index_n_heads", "index_head_dim", "index_block_size",
                "index_topk_blocks", "index_local_blocks", "n_shared_experts", "use_cache"}
    dropped = []
    for _ in range(len(optional) + 1):
        try:
            cfg = C.MiniMaxM3VLTextConfig(**kw)
            break
        except Exception as e:  # strict configs reject unknown keys
            bad = [k for k in optional if k in kw and k in str(e)]
            if not bad:
                raise
            for k in bad:
                kw.pop(k)
                dropped.append(k)
    if dropped:
        log("config keys not accepted by this transformers:", dropped)
    return cfg


def set_impl(model, attn):
    try:
        model.set_attn_implementation(attn)
    except Exception as e:
        log("set_attn_implementation failed:", repr(e)[:200])
        model.config._attn_implementation = attn
    try:
        model.set_experts_implementation("eager")
    except Exception:
        pass


def build_model(attn="sdpa"):
    _, M = tf_modules()
    cfg = build_text_config()
    model = M.MiniMaxM3VLForCausalLM(cfg)
    set_impl(model, attn)
    check_model(model)
    return model


def indexer_of(model, i):
    return model.model.layers[i].self_attn.indexer


def router_of(model, i):
    return model.model.layers[i].mlp.gate


def routing_bias_of(model, i):
    mlp = model.model.layers[i].mlp
    b = getattr(mlp.gate, "e_score_correction_bias", None)
    return b if b is not None else mlp.e_score_correction_bias


def check_model(model):
    m = model.model
    assert m.rotary_emb.inv_freq.numel() == ROTARY_DIM // 2, m.rotary_emb.inv_freq.shape
    for i, layer in enumerate(m.layers):
        idx = getattr(layer.self_attn, "indexer", None)
        if i < N_DENSE:
            assert idx is None, f"layer {i} should be dense"
            assert layer.mlp.gate_up_proj.weight.shape == (2 * DENSE_INTER, HIDDEN)
        else:
            assert idx is not None, f"layer {i} should be sparse"
            assert (idx.num_heads, idx.head_dim, idx.block_size, idx.topk_blocks) == (
                INDEX_HEADS, INDEX_DIM, BLOCK, TOPK_BLOCKS), vars(idx).keys()
            assert getattr(idx, "local_blocks", LOCAL_BLOCKS) == LOCAL_BLOCKS
            assert layer.mlp.experts.gate_up_proj.shape == (N_EXPERTS, 2 * EXPERT_INTER, HIDDEN)
            assert layer.mlp.experts.down_proj.shape == (N_EXPERTS, HIDDEN, EXPERT_INTER)
            assert routing_bias_of(model, i).shape == (N_EXPERTS,)


# ----------------------------------------------------------------------------------------------
# Block selection modes: "transformers" (as installed), "dense" (every block), "spec" (§2.6)
# ----------------------------------------------------------------------------------------------
def index_qk(idx, hidden_states, position_embeddings):
    """Index query/key after Gemma RMSNorm and RoPE, as MiniMaxM3VLIndexer.forward computes them."""
    _, M = tf_modules()
    b, s, _ = hidden_states.shape
    q = idx.q_norm(idx.q_proj(hidden_states).view(b, s, idx.num_heads, idx.head_dim)).transpose(1, 2)
    k = idx.k_norm(idx.k_proj(hidden_states).view(b, s, 1, idx.head_dim)).transpose(1, 2)
    cos, sin = position_embeddings
    return M.apply_rotary_pos_emb(q, k, cos[..., : idx.head_dim], sin[..., : idx.head_dim])


def block_scores(q, k, block):
    """Per index head: s[b,h,p,blk] = max over causal keys j in blk of <q_h(p), k(j)> (fp32);
    -inf for blocks after the query's own block. Queries are the last q_len of k_len positions."""
    q_len, k_len = q.shape[2], k.shape[2]
    nb = -(-k_len // block)
    qpos = torch.arange(k_len - q_len, k_len, device=q.device)
    kpos = torch.arange(nb * block, device=q.device)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2))
    s = F.pad(s, (0, nb * block - k_len), value=float("-inf"))
    s = s.masked_fill(kpos.view(1, -1) > qpos.view(-1, 1), float("-inf"))
    s = s.view(*s.shape[:-1], nb, block).amax(-1)
    blk_future = torch.arange(nb, device=q.device).view(1, -1) > (qpos // block).view(-1, 1)
    return s.masked_fill(blk_future, float("-inf")), qpos


def spec_select(scores, qpos, block, topk, local):
    """Spec §2.6 per index head: own block (and local-1 before it) forced first, then the best
    scores, ties to the lower block id; left-packed, -1 padded."""
    nb = scores.shape[-1]
    qb = qpos // block
    s = scores.clone()
    for l in range(local):
        b = (qb - l).clamp(min=0).view(1, 1, -1, 1).expand(*s.shape[:-1], 1)
        s.scatter_(-1, b, float("inf"))
    vals, ids = torch.sort(s, dim=-1, descending=True, stable=True)
    k = min(topk, nb)
    vals, ids = vals[..., :k], ids[..., :k]
    return ids.masked_fill(vals == float("-inf"), -1), vals


def spec_indexer_forward(self, hidden_states, position_embeddings, past_key_values=None, position_ids=None):
    """Drop-in for MiniMaxM3VLIndexer.forward (transformers 5.17 signature) that selects with the
    spec's rule (§2.6): per index head, own block forced, ties to the lower block id."""
    q, k = index_qk(self, hidden_states, position_embeddings)
    if past_key_values is not None:
        k = past_key_values.layers[self.layer_idx].update_index(k)
    scores, qpos = block_scores(q, k, self.block_size)
    ids, _ = spec_select(scores, qpos, self.block_size, self.topk_blocks, self.local_blocks)
    return ids  # [B, H_idx, S_q, K]: one selection per index head = per kv head


def set_mode(model, mode):
    for i in SPARSE_LAYERS:
        idx = indexer_of(model, i)
        idx.topk_blocks = 10**9 if mode == "dense" else TOPK_BLOCKS
        idx.__dict__.pop("forward", None)
        if mode == "spec":  # only the selection changes; transformers' build_block_mask expands it
            idx.forward = types.MethodType(spec_indexer_forward, idx)
        else:
            assert mode in ("dense", "transformers"), mode


# ----------------------------------------------------------------------------------------------
# Hooks: sparse-layer attention inputs (for the indexer loss) and router loads (for the bias)
# ----------------------------------------------------------------------------------------------
class Taps:
    def __init__(self, model):
        self.capture = False
        self.inputs = {}
        self.loads = {}
        for i in SPARSE_LAYERS:
            model.model.layers[i].self_attn.register_forward_pre_hook(self._attn_hook(i), with_kwargs=True)
            router_of(model, i).register_forward_hook(self._router_hook(i))

    def _attn_hook(self, i):
        def hook(mod, args, kwargs):
            if self.capture:
                hs = kwargs.get("hidden_states", args[0] if args else None)
                self.inputs[i] = (hs.detach(), tuple(t.detach() for t in kwargs["position_embeddings"]))
        return hook

    def _router_hook(self, i):
        def hook(mod, args, out):
            if self.capture:
                ids = out[2].reshape(-1)
                c = torch.bincount(ids, minlength=N_EXPERTS)
                self.loads[i] = self.loads.get(i, 0) + c
        return hook

    def clear(self):
        self.inputs.clear()
        self.loads.clear()


def update_routing_bias(model, taps, rate):
    with torch.no_grad():
        for i, load in taps.loads.items():
            load = load.float()
            routing_bias_of(model, i).add_(rate * torch.sign(load.mean() - load))


def attention_block_mass(attn, hs, pe):
    """Main attention probability mass per key block, averaged over the q heads of each kv group:
    [B, H_kv, S, n_blocks] (dense causal attention, fp32)."""
    _, M = tf_modules()
    b, s, _ = hs.shape
    hd = attn.head_dim
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        hs = hs.float()
        q = attn.q_norm(attn.q_proj(hs).view(b, s, -1, hd)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(hs).view(b, s, -1, hd)).transpose(1, 2)
        cos, sin = (t.float() for t in pe)
        q, k = M.apply_rotary_pos_emb(q, k, cos[..., :ROTARY_DIM], sin[..., :ROTARY_DIM])
        g = N_HEADS // N_KV
        q = q.reshape(b, N_KV, g, s, hd)
        logits = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * hd**-0.5  # [B,Hkv,G,S,S]
        causal = torch.ones(s, s, dtype=torch.bool, device=hs.device).triu(1)
        logits.masked_fill_(causal, float("-inf"))
        p = logits.softmax(-1)
        del logits
        nb = -(-s // BLOCK)
        p = F.pad(p, (0, nb * BLOCK - s)).view(b, N_KV, g, s, nb, BLOCK).sum(-1).mean(2)
    return p


def indexer_kl(model, taps):
    """Sum over sparse layers of mean KL(attention block mass || softmax(index block scores / sqrt(d)))
    per (index head = kv group, query position)."""
    total, recall = 0.0, []
    for i in SPARSE_LAYERS:
        hs, pe = taps.inputs[i]
        attn = model.model.layers[i].self_attn
        target = attention_block_mass(attn, hs, pe)  # [B,H,S,nb]
        with torch.autocast("cuda", enabled=False):
            q, k = index_qk(attn.indexer, hs.float(), tuple(t.float() for t in pe))
            scores, _ = block_scores(q, k, BLOCK)  # [B,H,S,nb]
            logp = F.log_softmax(scores * INDEX_DIM**-0.5, dim=-1)
            valid = torch.isfinite(scores)
            kl = torch.where(valid, target * (torch.log(target.clamp_min(1e-20)) - logp), torch.zeros_like(logp))
            total = total + kl.sum(-1).mean()
        with torch.no_grad():  # attention mass inside the blocks the spec rule selects, at positions that drop blocks
            qpos = torch.arange(scores.shape[2], device=scores.device)
            ids, _ = spec_select(scores.detach(), qpos, BLOCK, TOPK_BLOCKS, LOCAL_BLOCKS)
            mass = target.gather(-1, ids.clamp(min=0)).masked_fill(ids < 0, 0).sum(-1)
            sparse_pos = qpos >= TOPK_BLOCKS * BLOCK
            if sparse_pos.any():
                recall.append(mass[..., sparse_pos].mean().item())
    indexer_kl.last_recall = sum(recall) / len(recall) if recall else None
    return total


# ----------------------------------------------------------------------------------------------
# Checkpoint in the published layout
# ----------------------------------------------------------------------------------------------
def to_published(model):
    """transformers state_dict -> published MiniMax-M3 tensor names (docs in README.md)."""
    sd = model.state_dict()
    out = {}
    P = "language_model."
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous().cpu()
    f32 = lambda t: t.detach().to(torch.float32).contiguous().cpu()
    for name, t in sd.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if name in ("model.embed_tokens.weight", "model.norm.weight"):
            out[P + name] = bf(t)
        elif name == "lm_head.weight":
            out[P + "lm_head.weight"] = bf(t)
        elif m:
            i, rest = int(m.group(1)), m.group(2)
            L = f"{P}model.layers.{i}."
            if rest in ("input_layernorm.weight", "post_attention_layernorm.weight") or re.fullmatch(
                r"self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight", rest
            ):
                out[L + rest] = bf(t)
            elif mi := re.fullmatch(r"self_attn\.indexer\.(q_proj|k_proj|q_norm|k_norm)\.weight", rest):
                out[L + "self_attn.index_" + mi.group(1) + ".weight"] = bf(t)
            elif rest == "mlp.gate_up_proj.weight":
                gate, up = t.chunk(2, dim=0)
                out[L + "mlp.gate_proj.weight"] = bf(gate)
                out[L + "mlp.up_proj.weight"] = bf(up)
            elif rest == "mlp.down_proj.weight":
                out[L + "mlp.down_proj.weight"] = bf(t)
            elif rest == "mlp.gate.weight":
                out[L + "block_sparse_moe.gate.weight"] = f32(t)
            elif rest in ("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"):
                out[L + "block_sparse_moe.e_score_correction_bias"] = f32(t)
            elif rest == "mlp.experts.gate_up_proj":
                for e in range(t.shape[0]):
                    gate, up = t[e].chunk(2, dim=0)
                    out[L + f"block_sparse_moe.experts.{e}.w1.weight"] = bf(gate)
                    out[L + f"block_sparse_moe.experts.{e}.w3.weight"] = bf(up)
            elif rest == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[L + f"block_sparse_moe.experts.{e}.w2.weight"] = bf(t[e])
            elif rest == "mlp.shared_experts.gate_up_proj.weight":
                gate, up = t.chunk(2, dim=0)
                out[L + "block_sparse_moe.shared_experts.gate_proj.weight"] = bf(gate)
                out[L + "block_sparse_moe.shared_experts.up_proj.weight"] = bf(up)
            elif rest == "mlp.shared_experts.down_proj.weight":
                out[L + "block_sparse_moe.shared_experts.down_proj.weight"] = bf(t)
            else:
                raise KeyError(f"no published name for {name}")
        else:
            raise KeyError(f"no published name for {name}")
    return out


def from_published(tensors, model):
    """Inverse of to_published, into model's own state_dict names (fp32)."""
    P = "language_model."
    sd = {}
    for name in model.state_dict().keys():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        g = lambda k: tensors[k].float()
        if not m:
            sd[name] = g(P + name)
            continue
        i, rest = int(m.group(1)), m.group(2)
        L = f"{P}model.layers.{i}."
        if mi := re.fullmatch(r"self_attn\.indexer\.(q_proj|k_proj|q_norm|k_norm)\.weight", rest):
            sd[name] = g(L + "self_attn.index_" + mi.group(1) + ".weight")
        elif rest == "mlp.gate_up_proj.weight":
            sd[name] = torch.cat([g(L + "mlp.gate_proj.weight"), g(L + "mlp.up_proj.weight")], 0)
        elif rest == "mlp.gate.weight":
            sd[name] = g(L + "block_sparse_moe.gate.weight")
        elif rest in ("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"):
            sd[name] = g(L + "block_sparse_moe.e_score_correction_bias")
        elif rest == "mlp.experts.gate_up_proj":
            sd[name] = torch.stack([torch.cat([g(L + f"block_sparse_moe.experts.{e}.w1.weight"),
                                               g(L + f"block_sparse_moe.experts.{e}.w3.weight")], 0)
                                    for e in range(N_EXPERTS)])
        elif rest == "mlp.experts.down_proj":
            sd[name] = torch.stack([g(L + f"block_sparse_moe.experts.{e}.w2.weight") for e in range(N_EXPERTS)])
        elif rest == "mlp.shared_experts.gate_up_proj.weight":
            sd[name] = torch.cat([g(L + "block_sparse_moe.shared_experts.gate_proj.weight"),
                                  g(L + "block_sparse_moe.shared_experts.up_proj.weight")], 0)
        elif rest == "mlp.shared_experts.down_proj.weight":
            sd[name] = g(L + "block_sparse_moe.shared_experts.down_proj.weight")
        else:
            sd[name] = g(L + rest)
    return sd


def save_checkpoint(model, outdir):
    from safetensors.torch import save_file
    import transformers

    tensors = to_published(model)
    save_file(tensors, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "text_config": published_text_config(),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {
        "bos_token_id": BOS,
        "eos_token_id": [EOS],
        "pad_token_id": PAD,
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 40,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    return tensors


def load_checkpoint(outdir, attn="eager"):
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(outdir, "model.safetensors"))
    with open(os.path.join(outdir, "config.json")) as f:
        text = json.load(f)["text_config"]
    assert text == json.loads(json.dumps(published_text_config())), "config.json differs from the script's shape"
    model = build_model(attn).float().cuda()
    sd = from_published(tensors, model)
    missing, unexpected = model.load_state_dict(sd, strict=True)
    model.eval()
    return model, tensors


@torch.no_grad()
def hf_loader_check(model_dir, ref_model, ids):
    """Can transformers itself read the published-layout files? Parse config.json with
    MiniMaxM3VLConfig and load model.safetensors with MiniMaxM3SparseForConditionalGeneration.from_pretrained
    (vision tower shrunk: this checkpoint has none), then compare logits with our own loader."""
    C, M = tf_modules()
    out = {}
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    cfg = C.MiniMaxM3VLConfig(**raw)
    t = cfg.text_config
    out["parsed_text_config"] = {k: getattr(t, k, None) for k in (
        "layer_types", "mlp_layer_types", "index_n_heads", "index_head_dim", "index_block_size",
        "index_topk_blocks", "index_local_blocks", "rope_parameters", "hidden_act", "num_local_experts")}
    raw["vision_config"] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    raw["projector_hidden_size"] = 32
    cfg = C.MiniMaxM3VLConfig(**raw)
    vl, info = M.MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        model_dir, config=cfg, dtype=torch.float32, output_loading_info=True)
    set_impl(vl, "eager")
    vl = vl.cuda().eval()
    out["missing_keys"] = sorted(k for k in info.get("missing_keys", []) if "vision" not in k and "projector" not in k and "patch_merge" not in k)[:20]
    out["unexpected_keys"] = sorted(info.get("unexpected_keys", []))[:20]
    x = torch.tensor([ids], device="cuda")
    a = vl(input_ids=x, use_cache=False).logits.float()
    b = ref_model(input_ids=x, use_cache=False).logits.float()
    out["max_abs_logit_diff_vs_own_loader"] = float((a - b).abs().max())
    del vl
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
class Batches:
    def __init__(self, stream, batch, seq, seed):
        self.stream = stream
        self.batch, self.seq = batch, seq
        self.g = torch.Generator(device="cpu").manual_seed(seed)

    def next(self):
        starts = torch.randint(0, self.stream.numel() - self.seq, (self.batch,), generator=self.g)
        return torch.stack([self.stream[s : s + self.seq] for s in starts.tolist()]).cuda(non_blocking=True)


def lm_loss(model, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=x, labels=x, use_cache=False)
    return out.loss


@torch.no_grad()
def quick_eval(model, windows, mode):
    set_mode(model, mode)
    model.eval()
    losses = []
    for w in windows:
        losses.append(lm_loss(model, w[None].cuda()).item())
    model.train()
    return sum(losses) / len(losses)


def cosine(step, total, warm, peak, floor=0.1):
    if step < warm:
        return peak * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def plan_steps(times, budget_s, cap):
    per = sum(times) / len(times)
    return max(len(times) + 1, min(cap, int(budget_s / per)))


def phase_dense(model, taps, data, args, hist, eval_windows):
    set_mode(model, "dense")
    model.train()
    params = [p for p in model.parameters()]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    times, total, step = [], 10**9, 0
    t_start = time.time()
    cap = int(args.dense_tokens / (args.batch * CONTEXT))
    while step < total:
        t = time.time()
        for gparam in opt.param_groups:
            gparam["lr"] = cosine(step, total if total < 10**9 else 10**6, args.warmup, args.lr)
        x = data.next()
        taps.capture = True
        loss = lm_loss(model, x)
        taps.capture = False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        update_routing_bias(model, taps, args.bias_rate)
        taps.clear()
        step += 1
        if step <= 20:
            torch.cuda.synchronize()
            if step > 3:
                times.append(time.time() - t)
            if step == 20:
                total = plan_steps(times, args.dense_s - (time.time() - t_start), cap)
                log(f"dense: {sum(times)/len(times)*1000:.0f} ms/step, {args.batch*CONTEXT} tokens/step, "
                    f"planned {total} steps ({total*args.batch*CONTEXT/1e6:.1f}M tokens)")
        if step % args.log_every == 0 or step == total:
            rec = {"phase": "dense", "step": step, "loss": round(loss.item(), 4), "grad_norm": round(gn.item(), 3),
                   "lr": opt.param_groups[0]["lr"], "t": round(time.time() - T0, 1)}
            if step % (args.log_every * 4) == 0 or step == total:
                rec["heldout_loss_dense"] = round(quick_eval(model, eval_windows, "dense"), 4)
                set_mode(model, "dense")
            hist.append(rec)
            log(rec)
    return step


def phase_indexer(model, taps, data, args, hist):
    set_mode(model, "dense")
    for p in model.parameters():
        p.requires_grad_(False)
    idx_params = []
    for i in SPARSE_LAYERS:
        for p in indexer_of(model, i).parameters():
            p.requires_grad_(True)
            idx_params.append(p)
    opt = torch.optim.AdamW(idx_params, lr=args.idx_lr, betas=(0.9, 0.95), weight_decay=0.0)
    t_start, step = time.time(), 0
    while time.time() - t_start < args.indexer_s and step < args.indexer_max_steps:
        x = data.next()[: args.idx_batch]
        with torch.no_grad():
            taps.capture = True
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=x, use_cache=False, logits_to_keep=1)
            taps.capture = False
        kl = indexer_kl(model, taps)
        taps.clear()
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(idx_params, 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == 1:
            rec = {"phase": "indexer", "step": step, "kl_sum_layers": round(kl.item(), 4),
                   "selected_attention_mass": indexer_kl.last_recall, "t": round(time.time() - T0, 1)}
            hist.append(rec)
            log(rec)
    for p in model.parameters():
        p.requires_grad_(True)
    return step


def phase_sparse(model, taps, data, args, hist, eval_windows):
    set_mode(model, "transformers")
    model.train()
    idx_ids = {id(p) for i in SPARSE_LAYERS for p in indexer_of(model, i).parameters()}
    main = [p for p in model.parameters() if id(p) not in idx_ids]
    idxp = [p for p in model.parameters() if id(p) in idx_ids]
    opt = torch.optim.AdamW(
        [{"params": [p for p in main if p.ndim >= 2], "weight_decay": 0.1, "peak": args.sparse_lr},
         {"params": [p for p in main if p.ndim < 2], "weight_decay": 0.0, "peak": args.sparse_lr},
         {"params": idxp, "weight_decay": 0.0, "peak": args.idx_lr}],
        lr=args.sparse_lr, betas=(0.9, 0.95), fused=True)
    times, total, step = [], 10**9, 0
    t_start = time.time()
    while step < total:
        t = time.time()
        for gparam in opt.param_groups:
            gparam["lr"] = cosine(step, total if total < 10**9 else 10**6, 20, gparam["peak"], floor=0.0)
        x = data.next()
        taps.capture = True
        loss = lm_loss(model, x)
        taps.capture = False
        kl = indexer_kl(model, taps)
        opt.zero_grad(set_to_none=True)
        (loss + kl).backward()
        torch.nn.utils.clip_grad_norm_(main, 1.0)
        torch.nn.utils.clip_grad_norm_(idxp, 1.0)
        opt.step()
        update_routing_bias(model, taps, args.bias_rate)
        taps.clear()
        step += 1
        if step <= 12:
            torch.cuda.synchronize()
            if step > 2:
                times.append(time.time() - t)
            if step == 12:
                total = plan_steps(times, args.sparse_s - (time.time() - t_start), 10**9)
                log(f"sparse: {sum(times)/len(times)*1000:.0f} ms/step, planned {total} steps")
        if step % args.log_every == 0 or step == total:
            rec = {"phase": "sparse", "step": step, "loss": round(loss.item(), 4), "kl_sum_layers": round(kl.item(), 4),
                   "selected_attention_mass": indexer_kl.last_recall, "t": round(time.time() - T0, 1)}
            if step == total:
                rec["heldout_loss_sparse"] = round(quick_eval(model, eval_windows, "transformers"), 4)
                rec["heldout_loss_dense"] = round(quick_eval(model, eval_windows, "dense"), 4)
                set_mode(model, "transformers")
            hist.append(rec)
            log(rec)
    return step


# ----------------------------------------------------------------------------------------------
# Goldens and perplexity (fp32, eager attention, weights as saved)
# ----------------------------------------------------------------------------------------------
def r6(x):
    return [round(float(v), 6) for v in x]


@torch.no_grad()
def logprobs(model, ids):
    out = model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False)
    return out.logits[0].float().log_softmax(-1)


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    toks, lps, margins = [], [], []
    for _ in range(n):
        lp = logprobs(model, ids)[-1]
        top = lp.topk(2)
        t = int(lp.argmax())
        toks.append(t)
        lps.append(float(lp[t]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(t)
    return toks, lps, margins


@torch.no_grad()
def golden(model, tok, name, ids, mode, meta, n_gen=32, topk=20):
    set_mode(model, mode)
    lp = logprobs(model, ids)
    top = lp.topk(topk, dim=-1)
    tgt = lp[:-1].gather(1, torch.tensor(ids[1:], device="cuda")[:, None])[:, 0]
    g_ids, g_lps, g_margins = greedy(model, ids, n_gen)
    gen_check = None
    try:
        out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=n_gen, do_sample=False,
                             use_cache=True, pad_token_id=PAD)
        gen = out[0, len(ids):].tolist()
        gen_check = {"cached_generate_ids": gen, "matches_no_cache_prefix": gen == g_ids[: len(gen)]}
    except Exception as e:
        gen_check = {"error": repr(e)[:300]}
    rec = dict(meta)
    rec.update({
        "name": name,
        "semantics": mode,
        "n_prompt": len(ids),
        "prompt_ids": ids,
        "prompt_text": tok.decode(ids, skip_special_tokens=False),
        "topk": topk,
        "top_ids": top.indices.tolist(),
        "top_logprobs": [r6(row) for row in top.values.tolist()],
        "target_logprobs": r6(tgt.tolist()),
        "greedy_ids": g_ids,
        "greedy_logprobs": r6(g_lps),
        "greedy_top1_top2_margin": r6(g_margins),
        "greedy_text": tok.decode(g_ids, skip_special_tokens=False),
        "cached_generate_check": gen_check,
    })
    return rec


@torch.no_grad()
def selection_dump(model, taps, ids):
    """Per sparse layer and index head: the blocks transformers selected at every position, whether
    the spec rule (§2.6) selects the same set, and the smallest score gap at the top-k boundary
    (how far the selection is from a tie)."""
    set_mode(model, "transformers")
    got = {}
    hooks = [indexer_of(model, i).register_forward_hook(
        (lambda i: lambda m, a, o: got.__setitem__(i, o.detach()))(i)) for i in SPARSE_LAYERS]
    taps.capture = True
    model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False)
    taps.capture = False
    for h in hooks:
        h.remove()
    res = {}
    for i in SPARSE_LAYERS:
        hs, pe = taps.inputs[i]
        q, k = index_qk(indexer_of(model, i), hs, pe)
        scores, qpos = block_scores(q, k, BLOCK)  # [1, H, S, nb]
        spec_ids, _ = spec_select(scores, qpos, BLOCK, TOPK_BLOCKS, LOCAL_BLOCKS)
        tf_ids = got[i][0]  # [H, S, K]
        same = (torch.sort(tf_ids, -1).values == torch.sort(spec_ids[0], -1).values).all(-1)  # [H, S]
        own = (qpos // BLOCK).view(1, 1, -1, 1)
        other = scores.scatter(-1, own.expand(*scores.shape[:-1], 1), float("-inf"))
        srt = torch.sort(other, dim=-1, descending=True).values
        gap = None
        if srt.shape[-1] > TOPK_BLOCKS:
            a_, b_ = srt[..., TOPK_BLOCKS - 2], srt[..., TOPK_BLOCKS - 1]
            ok = torch.isfinite(b_)
            gap = float((a_ - b_)[ok].min()) if ok.any() else None
        res[str(i)] = {
            "block_ids": tf_ids.tolist(),
            "spec_rule_same_sets": bool(same.all()),
            "positions_differing_from_spec_rule": int((~same).any(0).sum()),
            "min_boundary_score_gap": gap,
        }
    taps.clear()
    return res


@torch.no_grad()
def perplexity(model, windows, mode, batch=4):
    set_mode(model, mode)
    nll, n = 0.0, 0
    for s in range(0, len(windows), batch):
        chunk = windows[s : s + batch]
        L = max(len(w) for w in chunk)  # only the last window is shorter; it runs alone
        same = [w for w in chunk if len(w) == L]
        rest = [w for w in chunk if len(w) != L]
        for group in ([same] if same else []) + [[w] for w in rest]:
            x = torch.stack(group).cuda()
            out = model(input_ids=x, use_cache=False)
            lp = out.logits.float().log_softmax(-1)
            t = lp[:, :-1].gather(2, x[:, 1:, None])[..., 0]
            nll -= t.sum().item()
            n += t.numel()
    return {"tokens": n, "mean_nll": nll / n, "perplexity": math.exp(nll / n)}


# ----------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--idx-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--sparse-lr", type=float, default=3e-4)
    ap.add_argument("--idx-lr", type=float, default=1e-3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--dense-s", type=float, default=150)
    ap.add_argument("--dense-tokens", type=float, default=16e6)
    ap.add_argument("--indexer-s", type=float, default=30)
    ap.add_argument("--indexer-max-steps", type=int, default=10**9)
    ap.add_argument("--sparse-s", type=float, default=45)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--prompt-lens", default="1500,1337,1900")
    args = ap.parse_args()
    if args.smoke:
        args.dense_s, args.indexer_s, args.sparse_s, args.log_every, args.warmup = 12, 5, 8, 10, 10

    import transformers
    import tokenizers
    import safetensors

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    log("versions", versions)

    model_dir = os.path.join(args.out, "model")
    gold_dir = os.path.join(args.out, "golden")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(gold_dir, exist_ok=True)
    run = {"versions": versions, "args": vars(args), "history": []}

    def write_run():
        with open(os.path.join(gold_dir, "run.json"), "w") as f:
            json.dump(run, f, indent=1)

    # ---- corpus + tokenizer
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "chat_template.jinja")) as f:
        template_src = f.read()
    template = jinja_template(template_src)
    train_docs = load_jsonl(os.path.join(args.corpus, "train.jsonl"))
    held_docs = load_jsonl(os.path.join(args.corpus, "heldout.jsonl"))
    rng = random.Random(args.seed)
    chats = chat_documents(train_docs, rng, template, fraction=0.15)
    log(f"{len(train_docs)} train docs, {len(held_docs)} held-out docs, {len(chats)} chat docs")
    tok = train_tokenizer([d["text"] for d in train_docs] + chats, model_dir, template_src)
    log("tokenizer trained:", tok.get_vocab_size(), "sample:", tok.encode("Call me Ishmael. ]~b]ai\n<think>").tokens)

    def encode_docs(texts, bos):
        encs = tok.encode_batch(texts, add_special_tokens=False)
        return [([BOS] if bos else []) + e.ids for e in encs]

    raw = encode_docs([d["text"] for d in train_docs], True)
    chat_ids = encode_docs(chats, False)
    docs = raw + chat_ids
    rng.shuffle(docs)
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    held = encode_docs([d["text"] for d in held_docs], True)
    held_stream = torch.tensor([t for d in held for t in d], dtype=torch.long)
    n_chat = sum(len(d) for d in chat_ids)
    log(f"train tokens {stream.numel()} (chat {n_chat}), held-out tokens {held_stream.numel()}")
    run["data"] = {"train_tokens": stream.numel(), "chat_tokens": n_chat, "heldout_tokens": held_stream.numel(),
                   "train_docs": len(train_docs), "chat_docs": len(chats), "heldout_docs": len(held_docs)}
    windows = [held_stream[s : s + CONTEXT] for s in range(0, held_stream.numel(), CONTEXT)]
    windows = [w for w in windows if w.numel() >= 2]
    eval_windows = windows[:: max(1, len(windows) // 8)][:8]

    # ---- model
    model = build_model("sdpa").cuda()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params/1e6:.2f}M parameters; attn impl {model.config._attn_implementation}; experts impl "
        f"{getattr(model.config, '_experts_implementation', None)}; rope {model.config.rope_parameters}")
    log(model)
    run["parameters"] = n_params
    taps = Taps(model)
    data = Batches(stream, args.batch, CONTEXT, args.seed)

    # ---- phases
    s1 = phase_dense(model, taps, data, args, run["history"], eval_windows)
    write_run()
    s2 = phase_indexer(model, taps, data, args, run["history"])
    run["after_indexer_heldout_loss"] = {m: round(quick_eval(model, eval_windows, m), 4)
                                         for m in ("dense", "transformers", "spec")}
    log("after indexer warm-up, held-out loss:", run["after_indexer_heldout_loss"])
    write_run()
    s3 = phase_sparse(model, taps, data, args, run["history"], eval_windows)
    run["steps"] = {"dense": s1, "indexer": s2, "sparse": s3}
    log("training done", run["steps"])

    # ---- save in the published layout, then reload into a fresh fp32 model
    tensors = save_checkpoint(model, model_dir)
    write_run()
    log("saved", len(tensors), "tensors;", sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6, "MB")
    for k in sorted(tensors)[:12] + sorted(tensors)[-6:]:
        log("  ", k, tuple(tensors[k].shape), str(tensors[k].dtype))
    del model
    torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, _ = load_checkpoint(model_dir, "eager")
    taps = Taps(model)
    log("reloaded; attn impl", model.config._attn_implementation)

    # tokenizer round trip through transformers
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(model_dir)
        chat_txt = hf_tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                              add_generation_prompt=True)
        run["hf_tokenizer_check"] = {"chat": chat_txt, "ids": hf_tok(chat_txt, add_special_tokens=False)["input_ids"],
                                     "class": type(hf_tok).__name__}
        log("hf tokenizer:", run["hf_tokenizer_check"])
    except Exception as e:
        run["hf_tokenizer_check"] = {"error": repr(e)[:300]}
        log("hf tokenizer check failed", repr(e)[:300])

    try:
        set_mode(model, "transformers")
        run["hf_loader_check"] = hf_loader_check(model_dir, model, held[0][:300])
    except Exception as e:
        run["hf_loader_check"] = {"error": repr(e)[:500]}
    log("hf loader check:", run["hf_loader_check"])
    write_run()

    meta = {"format": "sieve-golden-v1", "model": "models/minimax-m3-tiny", "dtype": "float32",
            "attn_implementation": "eager", "generator": "tests/reference/train_tiny_m3.py",
            "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    # ---- prompts from held-out text
    lens = [int(x) for x in args.prompt_lens.split(",")]
    if args.smoke:
        lens = [700]
    picks = [("moby_dick", lambda d: d["source"] == "moby-dick"), ("sotu_modern", lambda d: d["name"].startswith("2016")),
             ("sotu_1917", lambda d: d["name"].startswith("1917"))]
    prompts = []
    for (pname, pred), n in zip(picks, lens):
        cands = [(len(ids), j) for j, (d, ids) in enumerate(zip(held_docs, held)) if pred(d) and len(ids) >= n]
        cands.sort(reverse=True)
        j = cands[0][1]
        prompts.append((pname, held[j][:n], held_docs[j]["name"]))
    for pi, (pname, ids, src) in enumerate(prompts):
        for mode in ("transformers",) + (("dense",) if pi == 0 else ()):
            m2 = dict(meta, source={"corpus": "heldout", "doc": src, "first_tokens": len(ids)})
            rec = golden(model, tok, pname, ids, mode, m2)
            if mode == "transformers":  # the spec's selection rule, run through the same model
                set_mode(model, "transformers")
                ref = logprobs(model, ids)
                set_mode(model, "spec")
                rec["spec_rule_max_abs_logprob_diff"] = float((logprobs(model, ids) - ref).abs().max())
                set_mode(model, "dense")
                rec["dense_max_abs_logprob_diff"] = float((logprobs(model, ids) - ref).abs().max())
                set_mode(model, "transformers")
            path = os.path.join(gold_dir, f"{pname}.json" if mode == "transformers" else f"{pname}.{mode}.json")
            with open(path, "w") as f:
                json.dump(rec, f, separators=(",", ":"))
            log(f"golden {pname} {mode}: {len(ids)} tokens, spec diff {rec.get('spec_rule_max_abs_logprob_diff')}, "
                f"dense diff {rec.get('dense_max_abs_logprob_diff')}, greedy {rec['greedy_text']!r}, "
                f"min margin {min(rec['greedy_top1_top2_margin']):.4f}, check {rec['cached_generate_check'].get('matches_no_cache_prefix')}, "
                f"{os.path.getsize(path)/1e6:.2f} MB")
    sel = selection_dump(model, taps, prompts[0][1])
    with open(os.path.join(gold_dir, f"{prompts[0][0]}.selection.json"), "w") as f:
        json.dump({"format": "sieve-golden-selection-v1", "prompt": prompts[0][0], "layers": sel}, f, separators=(",", ":"))
    for i, s_ in sel.items():
        log(f"selection layer {i}: same as spec rule {s_['spec_rule_same_sets']} "
            f"({s_['positions_differing_from_spec_rule']} positions differ), min boundary gap {s_['min_boundary_score_gap']}")
    # chat prompt (short: dense in every mode)
    para = next(p for p in held_docs[0]["text"].split("\n") if len(p) > 200)
    head = para[: para.find(". ", 60) + 1] if para.find(". ", 60) > 0 else para[:120]
    chat_txt = template.render(messages=[{"role": "user", "content": "Continue this passage:\n" + head}],
                               add_generation_prompt=True)
    chat_ids = tok.encode(chat_txt, add_special_tokens=False).ids
    rec = golden(model, tok, "chat", chat_ids, "transformers", dict(meta, source={"chat_text": chat_txt}))
    with open(os.path.join(gold_dir, "chat.json"), "w") as f:
        json.dump(rec, f, separators=(",", ":"))
    log("chat:", repr(chat_txt), "->", repr(rec["greedy_text"]))
    write_run()

    # ---- held-out perplexity (full-context windows) and the unigram baseline
    ppl_windows = windows if not args.smoke else windows[:4]
    res = {"context": CONTEXT, "windows": len(ppl_windows),
           "procedure": "held-out docs in extract_corpus order, each as [bos]+ids, concatenated; "
                        "non-overlapping windows of 2048 tokens (last one shorter); every token but "
                        "the first of each window is scored given the window before it; fp32, eager"}
    for mode in ("transformers", "spec", "dense"):
        res[mode] = perplexity(model, ppl_windows, mode)
        log("perplexity", mode, res[mode])
    counts = torch.bincount(stream, minlength=VOCAB).double()
    p = (counts + 1) / (counts.sum() + VOCAB)
    sc = torch.cat([w[1:] for w in ppl_windows])
    uni = -p.log()[sc].mean().item()
    res["unigram"] = {"tokens": sc.numel(), "mean_nll": uni, "perplexity": math.exp(uni),
                      "note": "add-one smoothed unigram over the training token stream"}
    log("unigram", res["unigram"])
    run["perplexity"] = res
    with open(os.path.join(gold_dir, "heldout_perplexity.json"), "w") as f:
        json.dump(dict(meta, **res), f, indent=1)
    write_run()
    log("done")


if __name__ == "__main__":
    main()
