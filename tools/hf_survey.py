#!/usr/bin/env python3
"""Which Hugging Face transformers families train exactly in rannc, from both default exports.

Families: every causal-LM family of transformers' auto mapping
(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), plus BERT and RoBERTa (masked LM) and
T5 (conditional generation). Each is built from its config class's defaults
shrunk to a small size (2 layers, hidden 64, 4 heads, vocabulary 128,
dropout 0), random weights, nothing downloaded; a family whose config does
not build that way is listed with the reason. In a child process each:
  - data as users feed it: right-padded causal-LM batches (attention_mask 0
    and label -100 on padding), or masked-LM labels -100 except on the 15%
    masked tokens; the family's own loss (`labels=`);
  - PyTorch's own SGD losses over --steps batches of 8 (the reference);
  - both default exports (tools/survey_common.py): `torch.onnx.export(...,
    dynamic_shapes=...)` and `torch.export.export(..., strict=False)` +
    `torch.export.save`, the batch and the sequence dynamic in both, as
    Hugging Face exports a token model.
Then each file is planned on 2 stages in 2 micro-batches (analytic costs) and
trained with mpirun rannc-exec; the table says whether it planned, the
largest relative loss difference to PyTorch, and why it failed if it did
(exact means <= 1e-4). docs/front-ends.md keeps the latest table.

--dtype float64 builds, trains and exports the model in double (the data are
tokens either way), with --tolerance for "exact". It tells a float32 gap that
is the model's own conditioning from a fault: a fault stays, rounding
shrinks, down to float32's where a family computes in float32 whatever its
dtype (transformers' loss casts the logits to float32: Llama 1.2e-7).

  .venv/bin/python tools/hf_survey.py [--build build] [--only gpt2,llama,bert] [--named] [--json out.json]
  .venv/bin/python tools/hf_survey.py --rows docs/surveys/hf_families.jsonl   # resumes the whole survey
  .venv/bin/python tools/hf_survey.py --only llama --dtype float64 --tolerance 1e-6
"""

import argparse
import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import survey_common as sc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The families the issue names; --named surveys these only.
NAMED = ("gpt2", "gpt_neox", "opt", "llama", "mistral", "qwen2", "phi3", "gemma", "bert", "roberta", "t5")
MASKED = ("bert", "roberta")
SEQ, VOCAB, BATCH, SAMPLES, LR = 16, 128, 8, 32, 0.05

# Config fields shrunk (every name a family uses for the concept).
SMALL = {
    ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "n_embed"): 64,
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers"): 2,
    ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
     "decoder_attention_heads"): 4,
    ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"): 2,
    ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "ffn_hidden_size", "encoder_ffn_dim", "decoder_ffn_dim",
     "moe_intermediate_size", "shared_expert_intermediate_size"): 128,
    ("head_dim", "d_kv", "kv_channels"): 16,
    ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_sequence_length"): 64,
    ("vocab_size",): VOCAB,
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"): 4,
    ("num_experts_per_tok", "moe_topk", "top_k"): 2,
    ("encoder_layers", "decoder_layers"): 2,
    # Multi-head latent attention (DeepSeek and its kin): the rotary and plain parts of a head, its compressions.
    ("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"): 8,
    ("qk_head_dim",): 16,
    ("v_head_dim", "index_head_dim"): 16,
    ("kv_lora_rank",): 16,
    ("q_lora_rank",): 32,
    ("index_n_heads",): 2,
    ("index_topk",): 8,
    ("n_group", "topk_group"): 1,  # routed experts in groups: one group of the 4
    # State-space layers (Mamba 2 and the hybrids): heads, state, chunks and ranks.
    ("mamba_d_state", "state_size"): 16,
    ("mamba_chunk_size", "chunk_size"): 8,
    ("mamba_dt_rank", "time_step_rank", "adapter_rank"): 8,
}


def families():
    from transformers.models.auto import modeling_auto as ma
    names = list(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return names + [f for f in ("bert", "roberta", "t5") if f not in names]


def model_class(family):
    import transformers
    from transformers.models.auto import modeling_auto as ma
    if family in MASKED:
        return getattr(transformers, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES[family])
    if family == "t5":
        return transformers.T5ForConditionalGeneration
    return getattr(transformers, ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])


def small_config(family):
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(family)
    # A composite config (text and vision) whose causal-LM class takes its text part alone.
    wants = getattr(model_class(family), "config_class", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    if wants is not None and not isinstance(cfg, wants) and isinstance(text, wants):
        cfg = text
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    for c in {id(cfg): cfg, id(text): text}.values():
        for keys, v in SMALL.items():
            for k in keys:
                if isinstance(getattr(c, k, None), int) and not isinstance(getattr(c, k), bool):
                    try:
                        setattr(c, k, v)
                    except AttributeError:  # a size the config derives (a property without a setter)
                        pass
        for k in list(vars(c)):
            if ("dropout" in k or "pdrop" in k) and isinstance(getattr(c, k), float):
                setattr(c, k, 0.0)
        # Special tokens must be embedding rows; a pad token of 0 is the usual choice.
        for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                  "cls_token_id", "mask_token_id"):
            v = getattr(c, k, None)
            if isinstance(v, int) and v >= VOCAB:
                setattr(c, k, min(v, 3))
        if hasattr(c, "use_cache"):
            c.use_cache = False
        consistent(c)
    if family == "t5" and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = cfg.pad_token_id  # T5 starts decoding at its pad token (its own checkpoints do)
    return cfg


def consistent(c):
    """Sizes the shrunk config's dependent sizes from the ones SMALL set, as
    the families' defaults relate them (each head's size times the heads is
    the inner width)."""
    hidden = getattr(c, "hidden_size", None)
    if not isinstance(hidden, int):
        return
    heads = getattr(c, "num_attention_heads", None)
    if isinstance(heads, int):  # sizes some default configs leave unset (None) though their code reads them
        if hasattr(c, "head_dim") and getattr(c, "head_dim", 0) is None:
            c.head_dim = hidden // heads
        if hasattr(c, "num_key_value_heads") and getattr(c, "num_key_value_heads", 0) is None:
            c.num_key_value_heads = heads
    inner = getattr(c, "mamba_expand", getattr(c, "expand", 2)) * hidden
    for count_key, size_key in (("mamba_n_heads", "mamba_d_head"), ("n_mamba_heads", "mamba_headdim")):
        if isinstance(getattr(c, size_key, None), int):  # 8 state-space heads splitting the inner width
            setattr(c, count_key, 8)
            setattr(c, size_key, inner // 8)
    if isinstance(getattr(c, "state_size", None), int) and isinstance(getattr(c, "num_heads", None), int) \
            and isinstance(getattr(c, "head_dim", None), int):  # Mamba 2: heads x head size = the inner width
        c.num_heads = inner // c.head_dim
    if isinstance(getattr(c, "qk_rope_head_dim", None), int) and isinstance(getattr(c, "head_dim", None), int):
        c.head_dim = c.qk_rope_head_dim  # latent attention: the rotary embedding's size is the rotary part's
        if isinstance(getattr(c, "num_key_value_heads", None), int):
            c.num_key_value_heads = c.num_attention_heads  # and every head has its own keys and values
    if isinstance(getattr(c, "n_routed_experts", None), int) and getattr(c, "num_experts_per_tok", 0) is None:
        c.num_experts_per_tok = 2  # DeepSeek-V2's default config leaves the experts per token unset
    if isinstance(getattr(c, "attention_hidden_size", None), int):  # Zamba: attention over [hidden, hidden]
        c.attention_hidden_size = 2 * hidden
        if isinstance(getattr(c, "attention_head_dim", None), int):
            c.attention_head_dim = c.attention_hidden_size // c.num_attention_heads


def make_data(family, rng):
    import numpy as np
    tokens = rng.randint(4, VOCAB, size=(SAMPLES, SEQ)).astype(np.int64)
    if family in MASKED:  # DataCollatorForLanguageModeling's labels: -100 except where masked
        masked = rng.random_sample(tokens.shape) < 0.15
        masked[:, 1] = True  # every sample counts at least one token
        return {"input_ids": np.where(masked, 3, tokens), "attention_mask": np.ones_like(tokens),
                "labels": np.where(masked, tokens, -100)}
    lengths = rng.randint(SEQ // 4, SEQ + 1, size=(SAMPLES, 1))
    real = np.arange(SEQ)[None, :] < lengths  # right padding, as a tokenizer pads a batch
    ids = np.where(real, tokens, 0)
    out = {"input_ids": ids, "attention_mask": real.astype(np.int64), "labels": np.where(real, ids, -100)}
    if family == "t5":  # the targets are another sequence
        out["labels"] = np.where(real, rng.randint(4, VOCAB, size=(SAMPLES, SEQ)), -100).astype(np.int64)
    return out


def with_loss(net):
    """`net` as the survey trains and exports it: forward returns the family's own loss."""
    import torch.nn as nn

    class WithLoss(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, labels):
            return self.net(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss

    return WithLoss(net)


def child(family, folder, dtype):
    """Builds, trains (PyTorch) and exports one family into `folder`, its weights in `dtype`."""
    import numpy as np
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = small_config(family)
    model = with_loss(model_class(family)(cfg)).train().to(getattr(torch, dtype))
    names = ["input_ids", "attention_mask", "labels"]
    data = make_data(family, np.random.RandomState(1))
    initial = copy.deepcopy(model.state_dict())
    losses = sc.train_reference(model, data, names, STEPS, BATCH, LR)
    # T5's guards need a sequence of 3 or more: torch.export's suggested fix.
    seq = (3 if family == "t5" else 2, SEQ)
    exported = sc.export_all(model, initial, sc.batch(data, names, 0, BATCH), names, folder, seq=seq)
    sc.save_case(folder, data, names, losses, LR, BATCH, exported)


STEPS = 8


def main():
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", help="comma-separated model types (config.model_type), e.g. gpt2,llama,bert")
    ap.add_argument("--named", action="store_true", help="only the families issue 26 names")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--microbatches", type=int, default=2, help="micro-batches of the 2-stage plans (the survey's "
                    "table: 2); 1 separates a model's sensitivity to reassociation from rannc's")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="the model's dtype in the reference, the exports and rannc (see above)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="exact means every step's relative loss difference is within this")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--rows", help="resume: a JSON-lines file of rows; families with rows in it are skipped, new "
                    "rows are appended as they come, and the table covers the whole file")
    ap.add_argument("--table", action="store_true", help="with --rows: print the file's table, run nothing")
    ap.add_argument("--expect-exact", default="", help="comma-separated formats (onnx, pt2): exit 1 unless every "
                    "family trains exactly from them (the smoke test's assertion)")
    ap.add_argument("--child", nargs=2, metavar=("FAMILY", "FOLDER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    STEPS = a.steps
    if a.child:
        return child(*a.child, a.dtype)
    names = a.only.split(",") if a.only else list(NAMED) if a.named else families()
    kept = sc.RowsFile(a.rows, "family") if a.rows else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, fam in enumerate(names):
            if kept and (fam in kept.done or a.table):
                continue
            print(f"hf_survey: {fam} ({i + 1} of {len(names)})", file=sys.stderr, flush=True)
            folder = os.path.join(tmp, fam)
            os.makedirs(folder)
            rows += sc.case_rows("family", fam, folder,
                                 [sys.executable, __file__, "--steps", str(a.steps), "--dtype", a.dtype, "--child", fam,
                                  folder],
                                 a.build, a.mpirun, a.timeout, rows_file=kept, microbatches=a.microbatches,
                                 tolerance=a.tolerance)
    if kept:
        rows = kept.ordered(names)
    sc.print_table(rows, "family", len(names), "families", a.steps,
                   layout=f"2 stages, {a.microbatches} micro-batch{'es' if a.microbatches != 1 else ''}, {a.dtype}",
                   tolerance=a.tolerance)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    sc.expect_exact(rows, "family", a.expect_exact, "hf_survey")


if __name__ == "__main__":
    main()
