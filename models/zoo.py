"""Test models for rannc.

Every model's forward takes the graph inputs and returns the scalar training
loss, because rannc treats the loss as part of the graph (its only output).

Constraints these definitions respect so that the ONNX export is usable by the
rannc importer and the equivalence tests:
  * no dropout, no BatchNorm (results must not depend on the micro-batch split);
  * no float buffers: every float initializer in the ONNX file other than
    BatchNorm running statistics is treated as a trainable parameter, so masks /
    positions are computed inside forward;
  * reshapes use the runtime batch size, so the exported graph keeps a
    symbolic batch axis (Shape -> Gather -> Concat -> Reshape chains).

The torchvision classifiers (resnet18, mobilenet_v3_small, vit_tiny) are the
exception: real-world graphs with BatchNorm (whose running statistics are
buffers, Note [buffers] in planner/ir/ir.h), so their losses match PyTorch's
only with the whole batch in one micro-batch on one replica.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Three Linear layers (ReLU, GELU) + cross-entropy; inputs x [B, in], y [B]."""

    input_names = ("x", "y")

    def __init__(self, in_features=32, hidden=64, num_classes=10):
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        h = F.gelu(self.fc2(h))
        logits = self.fc3(h)
        return F.cross_entropy(logits, y)


class SelfAttention(nn.Module):
    """Multi-head self-attention with the softmax written out (no fused SDPA)."""

    def __init__(self, hidden, heads):
        super().__init__()
        assert hidden % heads == 0, "hidden must be divisible by heads"
        self.heads = heads
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, t):
        # Runtime sizes (not Python constants) keep the batch axis dynamic in ONNX.
        return t.view(t.size(0), t.size(1), self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, causal=False):
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if causal:
            # Built from Range/comparison rather than triu so it also exports at
            # opset 13 (Trilu needs opset 14), and stays a bool, never a float buffer.
            seq = x.size(1)
            pos = torch.arange(seq, device=x.device)
            future = pos.unsqueeze(0) > pos.unsqueeze(1)  # [S, S], True above the diagonal
            # Large finite negative instead of -inf: avoids inf*0 = NaN in backward.
            scores = scores.masked_fill(future, -1e9)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2)
        ctx = ctx.reshape(ctx.size(0), ctx.size(1), self.heads * self.head_dim)
        return self.out(ctx)


class FeedForward(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class PostLNBlock(nn.Module):
    """BERT encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attn = SelfAttention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


class PreLNBlock(nn.Module):
    """GPT decoder layer: x = x + Attn(LN(x)) (causal); x = x + FFN(LN(x))."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.ffn(self.ln2(x))


class _TokenModel(nn.Module):
    """Shared embedding / LM-head / loss plumbing for the BERT and GPT models."""

    input_names = ("input_ids", "labels")

    def __init__(self, vocab, hidden, heads, layers, seq_len, ffn, block, tie_embeddings=False):
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        ffn = ffn or 4 * hidden
        self.tok_emb = nn.Embedding(vocab, hidden)
        # Learned positions as a parameter table indexed by arange in forward
        # (a precomputed position buffer would be a non-parameter initializer).
        self.pos_emb = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList([block(hidden, heads, ffn) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        # The LM head's weight is its own parameter unless tied to the token
        # embedding (then it is one initializer that the first and the last
        # stage both read: Note [shared parameters] in executor/schedule/schedule.h).
        self.lm_head = nn.Linear(hidden, vocab)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
            # nn.Embedding's N(0, 1) would make the first logits ~N(0, hidden);
            # scale the shared table so they start near N(0, 1).
            nn.init.normal_(self.tok_emb.weight, std=hidden ** -0.5)

    # Hooks so BERT and GPT differ only in where the extra LayerNorm sits.
    def embed_norm(self, x):
        return x

    def final_norm(self, x):
        return x

    def forward(self, input_ids, labels):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        x = self.embed_norm(x)
        for blk in self.blocks:
            x = blk(x)
        x = self.final_norm(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))


class BERT(_TokenModel):
    """BERT-style post-LN encoder; loss = token-level CE on every position."""

    def __init__(self, vocab=100, hidden=64, heads=4, layers=2, seq_len=16, ffn=None):
        super().__init__(vocab, hidden, heads, layers, seq_len, ffn, PostLNBlock)

    def embed_norm(self, x):
        # BERT normalises the embedding sum; reuse ln_f's slot for that.
        return self.ln_f(x)


class GPT(_TokenModel):
    """GPT-style pre-LN decoder with a causal mask; labels are pre-shifted."""

    def __init__(self, vocab=100, hidden=64, heads=4, layers=2, seq_len=16, ffn=None, tie_embeddings=False):
        super().__init__(vocab, hidden, heads, layers, seq_len, ffn, PreLNBlock, tie_embeddings)

    def final_norm(self, x):
        return self.ln_f(x)


class NanoGPTAttention(nn.Module):
    """Causal self-attention as nanoGPT writes it: one c_attn projection split
    into q, k, v, and F.scaled_dot_product_attention(is_causal=True)."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class NanoGPTBlock(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = NanoGPTAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class NanoGPT(nn.Module):
    """A GPT in nanoGPT's idioms: wte/wpe in a ModuleDict, tied lm_head,
    chunked q/k/v, fused SDPA, the loss from F.cross_entropy on flattened
    logits with ignore_index=-1."""

    input_names = ("idx", "targets")

    def __init__(self, vocab=97, n_embd=48, n_head=4, layers=2, seq_len=16):
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd),
            wpe=nn.Embedding(seq_len, n_embd),
            h=nn.ModuleList([NanoGPTBlock(n_embd, n_head) for _ in range(layers)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class HFStyleAttention(nn.Module):
    """Attention as Hugging Face's BERT/GPT-2 code writes it: separate q/k/v
    Linears, heads by view+permute, an additive attention mask, and a tuple
    (context, attention probabilities) as the result."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.all_head_size = hidden
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(hidden, hidden)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        return (self.dense(context_layer), attention_probs)


class HFStyleLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.attention = HFStyleAttention(hidden, heads)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.output = nn.Linear(4 * hidden, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, hidden_states, attention_mask):
        self_outputs = self.attention(hidden_states, attention_mask)
        attention_output = self.attn_norm(self_outputs[0] + hidden_states)
        intermediate = nn.functional.gelu(self.intermediate(attention_output))
        layer_output = self.out_norm(self.output(intermediate) + attention_output)
        outputs = (layer_output,) + self_outputs[1:]
        return outputs


class HFStyleEncoder(nn.Module):
    """A BERT-like encoder in Hugging Face's idioms: tuple returns indexed by
    the caller, an extended attention mask built from a [B, T] padding mask
    ((1 - mask) * large negative, broadcast over heads), in-place residual
    updates, and masked-LM cross-entropy (ignore_index=-100)."""

    input_names = ("input_ids", "attention_mask", "labels")

    def __init__(self, vocab=89, hidden=32, heads=4, layers=2, seq_len=12):
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(seq_len, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layer = nn.ModuleList([HFStyleLayer(hidden, heads) for _ in range(layers)])
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, input_ids, attention_mask, labels):
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        embeddings = self.word_embeddings(input_ids)
        embeddings += self.position_embeddings(position_ids)
        hidden_states = self.emb_norm(embeddings)
        extended = attention_mask[:, None, None, :].to(dtype=hidden_states.dtype)
        extended = (1.0 - extended) * -10000.0
        all_attentions = ()
        for layer_module in self.layer:
            layer_outputs = layer_module(hidden_states, extended)
            hidden_states = layer_outputs[0]
            all_attentions = all_attentions + (layer_outputs[1],)
        logits = self.decoder(hidden_states)
        return F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1), ignore_index=-100)


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise SystemExit(f"zoo.py: the hf_* models need transformers ({e}); run tools/setup.sh")
    return transformers


class _HFModel(nn.Module):
    """A Hugging Face `transformers` model built from a small config with
    random weights (nothing downloaded), its own loss (`labels=`) as the
    output. The config turns off what would break exact equivalence: dropout
    0, no KV cache; attention is transformers' default (SDPA, exported as
    MatMul/Softmax by the legacy exporter; attn_implementation="eager" trains
    the same); forward returns `outputs[0]` of `return_dict=False`. Their non-persistent buffers (BERT's integer
    position_ids, Llama's rotary inv_freq) are inlined as constants by the
    legacy exporter; the default dynamo export keeps them as buffers, which
    rannc's importer tells from parameters by the export's signature (Note
    [export signature])."""

    input_names = ("input_ids", "labels")

    def __init__(self, cls, config, vocab, seq_len):
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        self.model = cls(config)

    # Forward's attention_mask is None, as users call the model (Hugging
    # Face's and PyTorch's export docs: model(input_ids, labels=...)), in
    # PyTorch's training, the trace and the dynamo and .pt2 exports. Only the
    # legacy ONNX exporter runs with an all-ones mask, set by make_model.py
    # on the causal LMs with `legacy_needs_mask`:
    # without one, transformers' create_causal_mask looks for packed
    # sequences in position_ids (torch.diff), and that exporter has no
    # aten::diff ("Exporting the operator 'aten::diff' to ONNX opset version
    # 17 is not supported"). A tokenizer's mask of an unpadded batch is all
    # ones: the model trained is the same.
    ones_mask = False
    legacy_needs_mask = False

    def forward(self, input_ids, labels):
        mask = torch.ones_like(input_ids) if self.ones_mask else None
        return self.model(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False,
                          return_dict=False)[0]


class HFGPT2(_HFModel):
    """transformers' GPT2LMHeadModel (Conv1D projections, tied lm_head, causal
    LM loss: the model shifts the labels itself, so labels = input_ids)."""

    legacy_needs_mask = True

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=hidden, n_layer=layers, n_head=heads,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                            bos_token_id=None, eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.GPT2LMHeadModel, cfg, vocab, seq_len)


class HFBert(_HFModel):
    """transformers' BertForMaskedLM (token-type and position embeddings,
    post-LN encoder, tied decoder); labels on every position."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=seq_len,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, use_cache=False,
                            loss_type="ForMaskedLM")
        super().__init__(tf.BertForMaskedLM, cfg, vocab, seq_len)


class HFLlama(_HFModel):
    """transformers' LlamaForCausalLM (RMSNorm, rotary positions, SwiGLU MLP,
    grouped-query attention with 2 key/value heads, untied lm_head)."""

    legacy_needs_mask = True

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2),
                             max_position_embeddings=seq_len, attention_dropout=0.0, use_cache=False,
                             bos_token_id=None, eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.LlamaForCausalLM, cfg, vocab, seq_len)


class HFQwen2(_HFModel):
    """transformers' Qwen2ForCausalLM (q/k/v biases, grouped-query attention,
    input and output embeddings tied), no attention mask: as a user calls it."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), max_position_embeddings=seq_len,
                             attention_dropout=0.0, use_cache=False, tie_word_embeddings=True,
                             bos_token_id=None, eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.Qwen2ForCausalLM, cfg, vocab, seq_len)


class SdpaDecoder(nn.Module):
    """A Llama-style decoder as people write it by hand: RMSNorm, rotary
    positions from a non-persistent buffer, SwiGLU, and
    F.scaled_dot_product_attention(is_causal=True); its own causal-LM loss."""

    input_names = ("input_ids", "labels")

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        super().__init__()
        self.vocab, self.seq_len, self.heads = vocab, seq_len, heads
        self.embed = nn.Embedding(vocab, hidden)
        hd = hidden // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq_len).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            blk = nn.Module()
            blk.norm1, blk.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
            blk.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            blk.proj = nn.Linear(hidden, hidden, bias=False)
            blk.gate, blk.up = nn.Linear(hidden, 2 * hidden, bias=False), nn.Linear(hidden, 2 * hidden, bias=False)
            blk.down = nn.Linear(2 * hidden, hidden, bias=False)
            self.layers.append(blk)
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def _rotate(self, x):
        a, b = x.chunk(2, dim=-1)
        return x * self.cos + torch.cat([-b, a], -1) * self.sin

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        B, T, H = x.shape
        for blk in self.layers:
            q, k, v = blk.qkv(blk.norm1(x)).view(B, T, 3, self.heads, H // self.heads).transpose(1, 3).unbind(2)
            a = F.scaled_dot_product_attention(self._rotate(q), self._rotate(k), v, is_causal=True)
            x = x + blk.proj(a.transpose(1, 2).reshape(B, T, H))
            h = blk.norm2(x)
            x = x + blk.down(F.silu(blk.gate(h)) * blk.up(h))
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), labels[:, 1:].reshape(-1))


class HFMistral(_HFModel):
    """transformers' MistralForCausalLM (Llama's layers with sliding-window
    attention, rotary inv_freq a non-persistent buffer, untied lm_head)."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.MistralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=layers, num_attention_heads=heads,
                               num_key_value_heads=max(1, heads // 2), max_position_embeddings=seq_len,
                               attention_dropout=0.0, use_cache=False, bos_token_id=None, eos_token_id=None,
                               loss_type="ForCausalLM")
        super().__init__(tf.MistralForCausalLM, cfg, vocab, seq_len)


class HFT5(_HFModel):
    """transformers' T5ForConditionalGeneration (encoder-decoder, relative
    position buckets, embeddings shared by encoder, decoder and lm_head); the
    decoder's inputs are the labels shifted right, as the model makes them.
    torch.export's guards need a sequence of 3 or more (its suggested fix)."""

    min_seq_len = 3

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.T5Config(vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=2 * hidden, num_layers=layers,
                          num_heads=heads, dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
                          pad_token_id=0, eos_token_id=None)
        super().__init__(tf.T5ForConditionalGeneration, cfg, vocab, seq_len)


class HFGPTNeoX(_HFModel):
    """transformers' GPTNeoXForCausalLM (fused query_key_value, partial rotary
    on a quarter of each head, parallel attention and MLP residuals, untied
    embed_out)."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.GPTNeoXConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=2 * hidden,
                               max_position_embeddings=seq_len, hidden_dropout=0.0, attention_dropout=0.0,
                               use_cache=False, bos_token_id=None, eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.GPTNeoXForCausalLM, cfg, vocab, seq_len)


class HFOPT(_HFModel):
    """transformers' OPTForCausalLM (learned positions offset by 2 and counted
    from the attention mask, ReLU MLP, tied lm_head); pad token 0, which the
    data never holds (an ONNX Gather does not know the embedding's
    padding_idx)."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.OPTConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           ffn_dim=2 * hidden, word_embed_proj_dim=hidden, max_position_embeddings=seq_len,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
                           use_cache=False, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                           loss_type="ForCausalLM")
        super().__init__(tf.OPTForCausalLM, cfg, vocab, seq_len)


class HFPhi3(_HFModel):
    """transformers' Phi3ForCausalLM (fused qkv_proj and gate_up_proj,
    grouped-query attention, rotary positions); pad token 0."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.Phi3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=max(1, heads // 2), max_position_embeddings=seq_len,
                            original_max_position_embeddings=seq_len, resid_pdrop=0.0, embd_pdrop=0.0,
                            attention_dropout=0.0, use_cache=False, pad_token_id=0, bos_token_id=None,
                            eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.Phi3ForCausalLM, cfg, vocab, seq_len)


class HFGemma(_HFModel):
    """transformers' GemmaForCausalLM (embeddings scaled by sqrt(hidden),
    RMSNorm with 1 + weight, GeGLU MLP, tied lm_head); pad token 0."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.GemmaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                             max_position_embeddings=seq_len, attention_dropout=0.0, use_cache=False,
                             pad_token_id=0, bos_token_id=None, eos_token_id=None, loss_type="ForCausalLM")
        super().__init__(tf.GemmaForCausalLM, cfg, vocab, seq_len)


class HFRoberta(_HFModel):
    """transformers' RobertaForMaskedLM (positions counted from the tokens
    that are not padding, offset by the pad token; tied decoder); pad token
    0, which the data never holds, as for hf_bert."""

    def __init__(self, vocab=100, hidden=32, heads=4, layers=2, seq_len=16):
        tf = _transformers()
        cfg = tf.RobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=4 * hidden,
                               max_position_embeddings=seq_len + 1, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, use_cache=False, pad_token_id=0,
                               bos_token_id=None, eos_token_id=None, loss_type="ForMaskedLM")
        super().__init__(tf.RobertaForMaskedLM, cfg, vocab, seq_len)


class VisionClassifier(nn.Module):
    """A torchvision classifier + cross-entropy; inputs x [B, 3, S, S], y [B].

    Dropout is disabled (p=0) so rannc's losses can match PyTorch's exactly.
    """

    input_names = ("x", "y")
    in_channels = 3

    def __init__(self, net, image_size, num_classes):
        super().__init__()
        self.net = net
        self.image_size = image_size
        self.num_classes = num_classes
        for m in self.net.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def _torchvision():
    try:
        import torchvision
    except ImportError as e:
        raise SystemExit(f"zoo.py: the torchvision models need python3-torchvision ({e}); run tools/setup.sh")
    return torchvision.models


def ResNet18(num_classes=10, image_size=32):
    """torchvision's ResNet-18 (BatchNorm, residual adds) on small images."""
    return VisionClassifier(_torchvision().resnet18(num_classes=num_classes), image_size, num_classes)


def MobileNetV3Small(num_classes=10, image_size=32):
    """torchvision's MobileNetV3-Small (depthwise convs, BatchNorm, squeeze-excitation, hardswish)."""
    return VisionClassifier(_torchvision().mobilenet_v3_small(num_classes=num_classes), image_size, num_classes)


def EfficientNetB0(num_classes=10, image_size=32):
    """torchvision's EfficientNet-B0 (MBConv: depthwise convs, squeeze-excitation
    with SiLU and sigmoid gates, BatchNorm), stochastic depth and dropout off."""
    net = _torchvision().efficientnet_b0(num_classes=num_classes, dropout=0.0, stochastic_depth_prob=0.0)
    return VisionClassifier(net, image_size, num_classes)


def RegNetY400MF(num_classes=10, image_size=32):
    """torchvision's RegNetY-400MF (grouped 3x3 convs, squeeze-excitation, BatchNorm)."""
    return VisionClassifier(_torchvision().regnet_y_400mf(num_classes=num_classes), image_size, num_classes)


def VitTiny(num_classes=10, image_size=32):
    """A tiny torchvision VisionTransformer (patch conv, class token, nn.MultiheadAttention)."""
    vit = _torchvision().vision_transformer.VisionTransformer(
        image_size=image_size, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=num_classes)
    # torchvision zero-initializes the head, which would leave every other
    # gradient of the first step zero; random weights exercise the whole graph.
    nn.init.normal_(vit.heads.head.weight, std=0.1)
    return VisionClassifier(vit, image_size, num_classes)


def ConvNeXtTiny(num_classes=10, image_size=32):
    """torchvision's ConvNeXt (7x7 depthwise convs, LayerNorm over channels,
    layer scale, no BatchNorm) at two tiny stages; layer scale 0.5 instead of
    1e-6 so the residual branches train visibly in a few steps."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    _torchvision()
    net = ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], stochastic_depth_prob=0.0,
                   layer_scale=0.5, num_classes=num_classes)
    return VisionClassifier(net, image_size, num_classes)


def SwinTiny(num_classes=10, image_size=32):
    """torchvision's Swin Transformer (shifted windows: roll, window
    partitioning, relative position bias, patch merging) at two tiny stages,
    stochastic depth off."""
    from torchvision.models.swin_transformer import SwinTransformer
    _torchvision()
    net = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4],
                          stochastic_depth_prob=0.0, num_classes=num_classes)
    return VisionClassifier(net, image_size, num_classes)


MODELS = {"mlp": MLP, "bert": BERT, "gpt": GPT, "resnet18": ResNet18, "mobilenet_v3_small": MobileNetV3Small,
          "vit_tiny": VitTiny, "nanogpt": NanoGPT, "hf_encoder": HFStyleEncoder,
          "hf_gpt2": HFGPT2, "hf_bert": HFBert, "hf_llama": HFLlama, "hf_qwen2": HFQwen2, "sdpa_llama": SdpaDecoder,
          "hf_mistral": HFMistral, "hf_t5": HFT5, "hf_gpt_neox": HFGPTNeoX, "hf_opt": HFOPT, "hf_phi3": HFPhi3,
          "hf_gemma": HFGemma, "hf_roberta": HFRoberta, "convnext_tiny": ConvNeXtTiny,
          "swin_tiny": SwinTiny, "efficientnet_b0": EfficientNetB0, "regnet_y_400mf": RegNetY400MF}
# transformers' causal LMs added for issue 26, each trained from both default exports.
CAUSAL_LMS = ("hf_gpt_neox", "hf_opt", "hf_phi3", "hf_gemma")
TOKEN_MODELS = ("bert", "gpt", "nanogpt", "hf_encoder", "hf_gpt2", "hf_bert", "hf_llama", "hf_qwen2", "sdpa_llama",
                "hf_mistral", "hf_t5") + CAUSAL_LMS + ("hf_roberta",)
VISION_MODELS = ("resnet18", "mobilenet_v3_small", "vit_tiny", "convnext_tiny", "swin_tiny", "efficientnet_b0",
                 "regnet_y_400mf")


def build(name, seed=0, **kwargs):
    """Construct model `name` with deterministic initial weights."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](**kwargs)
