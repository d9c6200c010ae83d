/*
 * lab_kvcache.cc - backend "lab_kvcache": the tiny decoder-only transformer "kvlm" served in the
 * server process, in C++ over libtorch, with a KV cache in a fixed pool of blocks (vLLM's paged KV
 * memory, Kwon et al., SOSP 2023) under Triton's iterative sequence batching (Orca's iteration-level
 * scheduling, OSDI 2022). Models generate_kv_paged and generate_kv_contiguous (and
 * generate_kv_recompute, the no-cache baseline of the benchmark).
 *
 * The model (spec: lab_backends/kvlm, build/models/kvlm/kvlm.pt copied into <version>/kvlm.pt) is
 * a TorchScript file; this backend reads only its named parameters (tok.weight, blocks.{i}.qkv.weight
 * ...) and its `vocabulary` attribute, and runs the forward itself, because a cache changes the
 * forward: module.forward would recompute every position at every step.
 *
 * KV memory: per layer one tensor [2 (K, V), kv_blocks, block_tokens, H, 16], allocated once per
 * instance. A sequence's block table lists its blocks; token position p lives in block
 * table[p / block_tokens] at offset p % block_tokens, i.e. at slot table[p/bt]*bt + p%bt of the
 * [kv_blocks*bt, H, 16] view (vLLM calls this the slot mapping). kv_layout:
 *   paged       a sequence holds ceil(cached tokens / block_tokens) blocks, anywhere in the pool; a new
 *               one when its last is full;
 *   contiguous  a sequence reserves ceil(256 / block_tokens) consecutive blocks (the maximum length)
 *               when it is admitted, as systems before paging did;
 *   recompute   no cache at all: every step runs the whole prefix (the baseline the cache is for).
 *
 * Every execution, one function per step (each commented with the Triton rule it follows):
 *   0. factories: null requests (READY 0) apart, a response factory for each real one;
 *   1. sort:      cancelled -> free its blocks; new -> read PROMPT, MAX_TOKENS (or refuse); known ->
 *                 running (has a cache) or waiting; sequences absent from this step -> reaped;
 *   2. plan:      blocks for this step's decodes (a running sequence whose last block is full gets a
 *                 new one; with none free the youngest running sequence is preempted: its blocks
 *                 freed, it waits and later prefills again, vLLM's recompute preemption), then
 *                 ADMISSION BY MEMORY: waiting sequences, oldest first, while their blocks are free;
 *                 the first that does not fit waits, and so do all after it (first come, first served);
 *   3. forward:   a PREFILL per admitted sequence (its whole prompt in one pass, filling its cache,
 *                 giving token 0), then ONE batched DECODE pass over every running sequence (one token
 *                 each, attending over its cached K/V, gathered from its blocks);
 *   4. stream:    each stepped sequence's token through its factory (FINAL on the last, its blocks
 *                 freed there);
 *   5. release:   statistics, then RESCHEDULE for an unfinished, waiting or cancelled request, ALL for
 *                 a finished or refused one.
 *
 * Outputs per token: TEXT, STEP, KIND ("prefill"/"decode"), BATCH (sequences stepped in this
 * execution), BLOCKS (this sequence's blocks after the step), FREE_BLOCKS (the pool's, after it).
 *
 * Build: lab_backends.server.kv_backend.build_kvcache() (native_backends' g++ line for libtorch:
 * -std=c++20 -Wall -Wextra -Werror, torch's headers as system headers, its ABI, -Wl,-z,defs, rpath).
 */
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/script.h>

#include "lab_framework_steps.h" /* the steps every C++ framework backend shares; config_json.h */

namespace {

using lab_fw::drop;
using lab_fw::make_error;
using lab_fw::now_ns;
using lab_fw::one_line;

constexpr const char* BACKEND = "lab_kvcache";
constexpr const char* MODEL_FILE = "kvlm.pt";
constexpr int64_t HEAD_DIM = 16;
constexpr int64_t MAX_LENGTH = 256; /* the model's positions: prompt + generated tokens <= 256 */

/* ------------------------------------------------------------------ small helpers */

std::string torch_message(const std::exception& ex) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&ex);
  return one_line(c10 != nullptr ? c10->what_without_backtrace() : ex.what(), 400);
}

/* ------------------------------------------------------------------ model: config and weights */

enum class Layout { PAGED, CONTIGUOUS, RECOMPUTE };

/* One transformer block's parameters, by the spec's names (blocks.{i}.<name>). */
struct Layer {
  at::Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

struct Weights {
  at::Tensor tok, pos, lnf_w, lnf_b, head;
  std::vector<Layer> layers;
  int64_t width = 0, heads = 0;
  std::string vocabulary;
  int16_t index[128];  /* ASCII byte -> token, -1 outside the vocabulary */
  int64_t space = 0;   /* what a character outside the vocabulary reads as */
};

/* Per model: the config's choices, and the weights (read once, shared by the instances). */
struct KvModel {
  std::string name, config_file, model_file;
  Layout layout = Layout::PAGED;
  int64_t kv_blocks = 0, block_tokens = 0, slots = 0; /* slots: max_batch_size, sequences at once */
  int64_t step_ms = 0;     /* a step lasts at least this long (0: as long as its compute); see pace() */
  long threads = 1;
  Weights w;
  std::string where() const { return std::string(BACKEND) + ": model '" + name + "': "; }
  int64_t max_blocks() const { return (MAX_LENGTH + block_tokens - 1) / block_tokens; }
};

/* parameters { key: "KEY" value { string_value: "..." } } as text: lab_fw::parameter. */
using lab_fw::parameter;

/* A whole-number parameter in [low, high]; absent: the fallback (or an error when there is none). */
TRITONSERVER_Error* number(const KvModel& m, const char* json, const char* key, int64_t low, int64_t high,
                           int64_t fallback, int64_t* out) {
  std::string text;
  if (!parameter(json, key, &text)) {
    if (fallback >= 0) {
      *out = fallback;
      return nullptr;
    }
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "needs parameter '" + key + "'; add "
                      "parameters { key: \"" + key + "\" value { string_value: \"...\" } } to " + m.config_file);
  }
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < low || v > high) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "parameter '" + key + "' must be a whole number " +
                      std::to_string(low) + ".." + std::to_string(high) + ", got '" + text + "'; fix it in " +
                      m.config_file);
  }
  *out = v;
  return nullptr;
}

/* The config this scheduling needs (as lab_iterative.c checks it): RESCHEDULE is refused unless the
 * iterative sequencer handles the model (core src/infer_request.cc:113-125 at r24.10), many
 * responses per request need a decoupled model, and `direct` fills an empty slot with a null
 * request whose READY control is the only mark it carries (core src/sequence_batch_scheduler/
 * sequence_batch_scheduler.cc:1745-1767). */
TRITONSERVER_Error* check_scheduling(const KvModel& m, const std::string& json) {
  if (json.find("\"iterative_sequence\":true") == std::string::npos ||
      json.find("\"decoupled\":true") == std::string::npos) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "needs sequence_batching { iterative_sequence: "
                      "true } and model_transaction_policy { decoupled: true } in " + m.config_file + ": it releases "
                      "unfinished requests with RESCHEDULE and streams one response per token");
  }
  bool ready = false; /* sequence_batching.control_input[i].name == "READY" */
  const char* controls = json_member(json_member(json.c_str(), "sequence_batching"), "control_input");
  size_t count = 0;
  json_element(controls, 0, &count);
  for (size_t i = 0; i < count && !ready; ++i) {
    char name[64] = "";
    ready = json_string(json_member(json_element(controls, i, &count), "name"), name, sizeof name) &&
            std::strcmp(name, "READY") == 0;
  }
  if (!ready || json.find("\"CONTROL_SEQUENCE_READY\"") == std::string::npos) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "needs a control input READY (kind "
                      "CONTROL_SEQUENCE_READY) in sequence_batching in " + m.config_file + ": the scheduler fills "
                      "empty slots with null requests, and READY 0 is how they are told apart");
  }
  return nullptr;
}

TRITONSERVER_Error* read_config(TRITONBACKEND_Model* model, KvModel* m) {
  lab_fw::ModelConfig c;
  RETURN_IF_ERROR(lab_fw::read_model_config(model, &c));
  m->name = c.name;
  m->config_file = c.config_file;
  m->model_file = c.folder + "/" + std::to_string(c.version) + "/" + MODEL_FILE; /* no default_model_filename */
  RETURN_IF_ERROR(check_scheduling(*m, c.json));

  const char* j = c.json.c_str();
  std::string layout;
  if (!parameter(j, "kv_layout", &layout)) layout = "paged";
  if (layout == "paged") m->layout = Layout::PAGED;
  else if (layout == "contiguous") m->layout = Layout::CONTIGUOUS;
  else if (layout == "recompute") m->layout = Layout::RECOMPUTE;
  else {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "parameter 'kv_layout' must be paged, contiguous "
                      "or recompute, got '" + layout + "'; fix it in " + m->config_file);
  }
  int64_t threads = 1;
  if (!json_int(json_member(j, "max_batch_size"), &m->slots) || m->slots < 1) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "max_batch_size is the number of sequence slots "
                      "(sequences at once); set it to 1 or more in " + m->config_file);
  }
  RETURN_IF_ERROR(number(*m, j, "block_tokens", 1, MAX_LENGTH, -1, &m->block_tokens));
  RETURN_IF_ERROR(number(*m, j, "kv_blocks", 1, 1 << 20, -1, &m->kv_blocks));
  RETURN_IF_ERROR(number(*m, j, "INTRA_OP_THREAD_COUNT", 0, 1024, 1, &threads));
  RETURN_IF_ERROR(number(*m, j, "step_ms", 0, 10000, 0, &m->step_ms));
  m->threads = static_cast<long>(threads);
  if (m->layout == Layout::CONTIGUOUS && m->kv_blocks < m->max_blocks()) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "kv_blocks " + std::to_string(m->kv_blocks) +
                      " cannot hold one contiguous reservation of " + std::to_string(m->max_blocks()) + " blocks (" +
                      std::to_string(MAX_LENGTH) + " tokens / block_tokens " + std::to_string(m->block_tokens) +
                      "); raise kv_blocks in " + m->config_file);
  }
  return nullptr;
}

/* One named parameter of the TorchScript module, of the shape the spec gives it. */
TRITONSERVER_Error* take(const KvModel& m, const std::map<std::string, at::Tensor>& params, const std::string& key,
                         std::vector<int64_t> shape, at::Tensor* out) {
  auto found = params.find(key);
  if (found == params.end()) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + m.model_file + " has no parameter '" + key +
                      "' (the kvlm spec's names); export it again with `lab-backends setup`");
  }
  const at::Tensor& t = found->second;
  bool fits = t.scalar_type() == at::kFloat && t.dim() == static_cast<int64_t>(shape.size());
  for (size_t d = 0; fits && d < shape.size(); ++d) fits = shape[d] < 0 || t.size(static_cast<int64_t>(d)) == shape[d];
  if (!fits) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "parameter '" + key + "' of " + m.model_file +
                      " is " + c10::toString(t.scalar_type()) + " " + c10::str(t.sizes()) +
                      ", not float32 of the kvlm spec's shape");
  }
  *out = t.detach().contiguous();
  return nullptr;
}

/* The vocabulary: ASCII, each character once, the space among them (spec: sorted chars + space). */
TRITONSERVER_Error* index_vocabulary(const KvModel& m, Weights* w) {
  for (int16_t& i : w->index) i = -1;
  for (size_t i = 0; i < w->vocabulary.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(w->vocabulary[i]);
    if (c >= 128 || w->index[c] != -1) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "the vocabulary of " + m.model_file +
                        " has a character that is not ASCII or repeats (byte " + std::to_string(c) + ")");
    }
    w->index[c] = static_cast<int16_t>(i);
  }
  if (w->index[static_cast<int>(' ')] < 0) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "the vocabulary of " + m.model_file + " has no space");
  }
  w->space = w->index[static_cast<int>(' ')];
  return nullptr;
}

/* Load kvlm.pt (torch::jit::load, as pytorch_backend does, src/libtorch.cc ~L298 at r24.10) and keep
 * its parameters by name; the module itself is not kept: its forward has no cache. */
TRITONSERVER_Error* load_weights(KvModel* m) {
  std::map<std::string, at::Tensor> params;
  Weights& w = m->w;
  try {
    torch::jit::Module module = torch::jit::load(m->model_file, torch::kCPU);
    for (const auto& p : module.named_parameters(true)) params[p.name] = p.value;
    w.vocabulary = module.attr("vocabulary").toStringRef();
  } catch (const std::exception& ex) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "libtorch could not load " + m->model_file +
                      " as the kvlm TorchScript file (parameters and a 'vocabulary' attribute): " + torch_message(ex) +
                      "; run `lab-backends setup` to train and copy it there");
  }
  RETURN_IF_ERROR(index_vocabulary(*m, &w));
  const int64_t v = static_cast<int64_t>(w.vocabulary.size());
  RETURN_IF_ERROR(take(*m, params, "tok.weight", {v, -1}, &w.tok));
  w.width = w.tok.size(1);
  const int64_t d = w.width;
  if (d % HEAD_DIM != 0) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "width " + std::to_string(d) + " is not a multiple "
                      "of the head size " + std::to_string(HEAD_DIM));
  }
  w.heads = d / HEAD_DIM;
  RETURN_IF_ERROR(take(*m, params, "pos.weight", {MAX_LENGTH, d}, &w.pos));
  for (int i = 0; params.count("blocks." + std::to_string(i) + ".qkv.weight") != 0; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Layer l;
    RETURN_IF_ERROR(take(*m, params, b + "ln1.weight", {d}, &l.ln1_w));
    RETURN_IF_ERROR(take(*m, params, b + "ln1.bias", {d}, &l.ln1_b));
    RETURN_IF_ERROR(take(*m, params, b + "qkv.weight", {3 * d, d}, &l.qkv_w));
    RETURN_IF_ERROR(take(*m, params, b + "qkv.bias", {3 * d}, &l.qkv_b));
    RETURN_IF_ERROR(take(*m, params, b + "proj.weight", {d, d}, &l.proj_w));
    RETURN_IF_ERROR(take(*m, params, b + "proj.bias", {d}, &l.proj_b));
    RETURN_IF_ERROR(take(*m, params, b + "ln2.weight", {d}, &l.ln2_w));
    RETURN_IF_ERROR(take(*m, params, b + "ln2.bias", {d}, &l.ln2_b));
    RETURN_IF_ERROR(take(*m, params, b + "fc1.weight", {-1, d}, &l.fc1_w));
    RETURN_IF_ERROR(take(*m, params, b + "fc1.bias", {l.fc1_w.size(0)}, &l.fc1_b));
    RETURN_IF_ERROR(take(*m, params, b + "fc2.weight", {d, l.fc1_w.size(0)}, &l.fc2_w));
    RETURN_IF_ERROR(take(*m, params, b + "fc2.bias", {d}, &l.fc2_b));
    w.layers.push_back(l);
  }
  if (w.layers.empty()) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + m->model_file + " has no blocks.0.qkv.weight");
  }
  RETURN_IF_ERROR(take(*m, params, "ln_f.weight", {d}, &w.lnf_w));
  RETURN_IF_ERROR(take(*m, params, "ln_f.bias", {d}, &w.lnf_b));
  return take(*m, params, "head.weight", {v, d}, &w.head);
}

/* ------------------------------------------------------------------ instance: the pool and the sequences */

/* The KV pool: per layer [2, kv_blocks, block_tokens, H, 16], zeroed once; which blocks are in use. */
struct Pool {
  std::vector<at::Tensor> layers;
  std::vector<bool> used;
  int64_t free = 0;

  /* n blocks for a paged table: the lowest free ones, anywhere (the caller checked n <= free). */
  std::vector<int64_t> take_any(int64_t n) {
    std::vector<int64_t> got;
    for (size_t b = 0; b < used.size() && static_cast<int64_t>(got.size()) < n; ++b) {
      if (!used[b]) got.push_back(static_cast<int64_t>(b));
    }
    for (int64_t b : got) used[b] = true;
    free -= static_cast<int64_t>(got.size());
    return got;
  }
  /* n consecutive blocks (a contiguous reservation), first fit; empty when no run is long enough. */
  std::vector<int64_t> take_run(int64_t n) {
    int64_t run = 0;
    for (size_t b = 0; b < used.size(); ++b) {
      run = used[b] ? 0 : run + 1;
      if (run == n) {
        std::vector<int64_t> got;
        for (int64_t k = static_cast<int64_t>(b) - n + 1; k <= static_cast<int64_t>(b); ++k) got.push_back(k);
        for (int64_t k : got) used[k] = true;
        free -= n;
        return got;
      }
    }
    return {};
  }
  void give(std::vector<int64_t>* blocks) {
    for (int64_t b : *blocks) used[b] = false;
    free += static_cast<int64_t>(blocks->size());
    blocks->clear();
  }
};

/* One generation, kept across executions by its correlation ID. */
struct Sequence {
  std::vector<int64_t> tokens; /* the prompt, then every generated token */
  int32_t prompt = 0, max_tokens = 0, generated = 0;
  int64_t cached = 0;          /* positions whose K/V are in its blocks */
  std::vector<int64_t> blocks; /* the block table */
  bool admitted = false;       /* admitted (and not preempted since): it has its cache */
  uint64_t arrival = 0;        /* first come, first served */
};

struct KvInstance {
  KvModel* model = nullptr;
  Pool pool;
  std::map<uint64_t, Sequence> live;
  uint64_t arrivals = 0;
};

/* ------------------------------------------------------------------ the forward, from the named parameters */

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::layer_norm(x, {x.size(-1)}, w, b, 1e-5);
}

at::Tensor mlp(const Layer& l, const at::Tensor& x) { /* GELU exact (erf), torch's default */
  return at::linear(at::gelu(at::linear(layer_norm(x, l.ln2_w, l.ln2_b), l.fc1_w, l.fc1_b)), l.fc2_w, l.fc2_b);
}

/* The next token of each row of x [rows, D] (the last position of each sequence): argmax, the first
 * of equal maxima, as torch.argmax. */
std::vector<int64_t> next_tokens(const Weights& w, const at::Tensor& x) {
  at::Tensor best = at::argmax(at::linear(layer_norm(x, w.lnf_w, w.lnf_b), w.head), -1).contiguous();
  const int64_t* p = best.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + best.numel());
}

/* The [kv_blocks*bt, H, 16] slot view of layer l's K (kv 0) or V (kv 1) plane. */
at::Tensor plane(const KvInstance& in, size_t l, int kv) {
  const KvModel& m = *in.model;
  return in.pool.layers[l].select(0, kv).view({m.kv_blocks * m.block_tokens, m.w.heads, HEAD_DIM});
}

/* The pool slot of each of positions [from, to) of a sequence: its block table read at p / bt. */
std::vector<int64_t> slots_of(const KvModel& m, const Sequence& s, int64_t from, int64_t to) {
  std::vector<int64_t> slots;
  for (int64_t p = from; p < to; ++p) slots.push_back(s.blocks[p / m.block_tokens] * m.block_tokens + p % m.block_tokens);
  return slots;
}

at::Tensor long_tensor(const std::vector<int64_t>& v) {
  return torch::tensor(at::ArrayRef<int64_t>(v), torch::dtype(torch::kLong));
}

/* PREFILL: the whole of tokens[0, n) in one pass, causal attention among them; with a cache, every
 * position's K/V written into the sequence's blocks (index_copy_ at its slots). The next token. */
int64_t prefill(KvInstance* in, Sequence* s, bool cache) {
  const KvModel& m = *in->model;
  const Weights& w = m.w;
  const int64_t n = static_cast<int64_t>(s->tokens.size());
  const int64_t h = w.heads;
  at::Tensor x = w.tok.index_select(0, long_tensor(s->tokens)) + w.pos.narrow(0, 0, n);
  at::Tensor slots = cache ? long_tensor(slots_of(m, *s, 0, n)) : at::Tensor();
  at::Tensor causal = at::ones({n, n}, torch::dtype(torch::kBool)).triu(1); /* true: a future position */
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const Layer& L = w.layers[l];
    at::Tensor qkv = at::linear(layer_norm(x, L.ln1_w, L.ln1_b), L.qkv_w, L.qkv_b).view({n, 3, h, HEAD_DIM});
    at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2); /* [n, H, 16] */
    if (cache) {
      plane(*in, l, 0).index_copy_(0, slots, k);
      plane(*in, l, 1).index_copy_(0, slots, v);
    }
    at::Tensor scores = at::matmul(q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2)) / std::sqrt(double(HEAD_DIM));
    at::Tensor att = at::softmax(scores.masked_fill(causal, -INFINITY), -1);      /* [H, n, n] */
    at::Tensor out = at::matmul(att, v.transpose(0, 1)).transpose(0, 1).reshape({n, w.width});
    x = x + at::linear(out, L.proj_w, L.proj_b);
    x = x + mlp(L, x);
  }
  if (cache) s->cached = n;
  return next_tokens(w, x.narrow(0, n - 1, 1))[0];
}

/* DECODE, batched: one token per sequence (its last, at position `cached`), all B sequences in one
 * pass. Each writes its new K/V into its slot, then attends over its own cached positions, gathered
 * from its blocks into a [B, H, longest, 16] tensor; positions past a sequence's length are masked.
 * The next token of each. */
std::vector<int64_t> decode(KvInstance* in, const std::vector<Sequence*>& batch) {
  const KvModel& m = *in->model;
  const Weights& w = m.w;
  const int64_t b = static_cast<int64_t>(batch.size()), h = w.heads;
  int64_t longest = 0;
  std::vector<int64_t> last, position, write;
  for (Sequence* s : batch) {
    last.push_back(s->tokens.back());
    position.push_back(s->cached);
    write.push_back(slots_of(m, *s, s->cached, s->cached + 1)[0]);
    longest = std::max(longest, s->cached + 1);
  }
  std::vector<int64_t> gather(static_cast<size_t>(b * longest), 0); /* padding reads slot 0, masked */
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int64_t> own = slots_of(m, *batch[i], 0, batch[i]->cached + 1);
    std::copy(own.begin(), own.end(), gather.begin() + i * longest);
  }
  at::Tensor gather_t = long_tensor(gather);
  at::Tensor mask = (at::arange(longest, torch::dtype(torch::kLong)).unsqueeze(0) >
                     long_tensor(position).unsqueeze(1)).view({b, 1, 1, longest}); /* true: past its length */
  at::Tensor write_t = long_tensor(write);
  at::Tensor x = w.tok.index_select(0, long_tensor(last)) + w.pos.index_select(0, long_tensor(position));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const Layer& L = w.layers[l];
    at::Tensor qkv = at::linear(layer_norm(x, L.ln1_w, L.ln1_b), L.qkv_w, L.qkv_b).view({b, 3, h, HEAD_DIM});
    at::Tensor keys = plane(*in, l, 0), values = plane(*in, l, 1);
    keys.index_copy_(0, write_t, qkv.select(1, 1));
    values.index_copy_(0, write_t, qkv.select(1, 2));
    at::Tensor k = keys.index_select(0, gather_t).view({b, longest, h, HEAD_DIM}).permute({0, 2, 1, 3});
    at::Tensor v = values.index_select(0, gather_t).view({b, longest, h, HEAD_DIM}).permute({0, 2, 1, 3});
    at::Tensor q = qkv.select(1, 0).unsqueeze(2);                                    /* [B, H, 1, 16] */
    at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(double(HEAD_DIM)); /* [B, H, 1, longest] */
    at::Tensor att = at::softmax(scores.masked_fill(mask, -INFINITY), -1);
    at::Tensor out = at::matmul(att, v).reshape({b, w.width});
    x = x + at::linear(out, L.proj_w, L.proj_b);
    x = x + mlp(L, x);
  }
  for (Sequence* s : batch) s->cached += 1;
  return next_tokens(w, x);
}

/* ------------------------------------------------------------------ step 0-1: factories, sort */

enum class Kind { NUL, REFUSED, CANCELLED, WAITING, PREFILL, DECODE };
struct Slot {
  Kind kind = Kind::NUL;
  TRITONBACKEND_ResponseFactory* factory = nullptr;
  uint64_t id = 0;
  Sequence* seq = nullptr;
  int64_t token = -1;
  bool done = false, ok = true;
};

/* One INT32 element of input `name` (MAX_TOKENS, READY). */
TRITONSERVER_Error* read_int32(TRITONBACKEND_Request* request, const char* name, int32_t* value) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  uint64_t bytes = 0;
  uint32_t buffers = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, name, &input));
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, nullptr, &dtype, nullptr, nullptr, &bytes, &buffers));
  const void* buffer = nullptr;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  if (dtype == TRITONSERVER_TYPE_INT32 && bytes == 4 && buffers == 1) {
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &mem, &mem_id));
  }
  if (buffer == nullptr || size != 4 || mem == TRITONSERVER_MEMORY_GPU) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": " + name + " must be one INT32");
  }
  std::memcpy(value, buffer, 4);
  return nullptr;
}

/* PROMPT: one BYTES element (a 4-byte little-endian length, then the bytes), possibly in pieces. */
TRITONSERVER_Error* read_prompt(TRITONBACKEND_Request* request, std::string* text) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  uint64_t bytes = 0;
  uint32_t buffers = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "PROMPT", &input));
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, nullptr, &dtype, nullptr, nullptr, &bytes, &buffers));
  std::string raw;
  for (uint32_t i = 0; i < buffers; ++i) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &mem, &mem_id));
    raw.append(static_cast<const char*>(buffer), size);
  }
  uint32_t length = 0;
  if (raw.size() >= 4) std::memcpy(&length, raw.data(), 4);
  if (dtype != TRITONSERVER_TYPE_BYTES || raw.size() < 4 || 4 + static_cast<uint64_t>(length) != raw.size()) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": PROMPT must be one string (BYTES, shape [1])");
  }
  *text = raw.substr(4);
  return nullptr;
}

/* UTF-8 text -> tokens, one per character as Python counts them; a character outside the vocabulary
 * (any non-ASCII one among them) reads as the space (spec). Malformed UTF-8 is refused. */
TRITONSERVER_Error* tokenize(const Weights& w, const std::string& text, std::vector<int64_t>* tokens) {
  for (size_t at = 0; at < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[at]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    for (size_t k = 1; len != 0 && k < len; ++k) {
      if (at + k >= text.size() || (static_cast<unsigned char>(text[at + k]) & 0xC0) != 0x80) len = 0;
    }
    if (len == 0) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": PROMPT is not valid UTF-8 (byte " +
                        std::to_string(at) + "); send UTF-8 text");
    }
    tokens->push_back(len == 1 && w.index[c] >= 0 ? w.index[c] : w.space);
    at += len;
  }
  return nullptr;
}

/* The most blocks a paged sequence ever holds: its last token is sent, never fed back, so at most
 * prompt + max_tokens - 1 positions are cached. Admission asks for min(prompt's + 1, this): a
 * sequence alone in the pool always fits, and always finishes. */
int64_t most_blocks(const KvModel& m, const Sequence& s) {
  return (s.prompt + static_cast<int64_t>(s.max_tokens) - 1 + m.block_tokens - 1) / m.block_tokens;
}

/* A new generation: its prompt and length, checked against the model's 256 positions and the pool. */
TRITONSERVER_Error* start(KvInstance* in, TRITONBACKEND_Request* request, Sequence* s) {
  const KvModel& m = *in->model;
  std::string text;
  RETURN_IF_ERROR(read_prompt(request, &text));
  RETURN_IF_ERROR(read_int32(request, "MAX_TOKENS", &s->max_tokens));
  RETURN_IF_ERROR(tokenize(m.w, text, &s->tokens));
  s->prompt = static_cast<int32_t>(s->tokens.size());
  if (s->prompt < 1 || s->max_tokens < 1 || s->prompt + static_cast<int64_t>(s->max_tokens) > MAX_LENGTH) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": a prompt of " +
                      std::to_string(s->prompt) + " characters and MAX_TOKENS " + std::to_string(s->max_tokens) +
                      ": need a prompt of 1 or more characters, MAX_TOKENS >= 1 and the two together <= " +
                      std::to_string(MAX_LENGTH) + " (the model's positions)");
  }
  /* One that could never fit: more blocks at its full length than the whole pool (spec). */
  const int64_t full = most_blocks(m, *s);
  if (m.layout == Layout::PAGED && full > m.kv_blocks) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": this generation needs " +
                      std::to_string(full) + " KV blocks at its full length, the pool has " +
                      std::to_string(m.kv_blocks) + "; ask for fewer tokens or raise kv_blocks");
  }
  s->arrival = ++in->arrivals;
  return nullptr;
}

/* Step 0: null requests apart; a response factory for every real one (a decoupled model answers
 * through one: backend README "Decoupled Responses" at r24.10), all before anything else. If one
 * cannot be made, none is kept and Execute returns the error: Triton still owns the requests and
 * answers each with it (backend examples/backends/recommended/src/recommended.cc L499-517). A null
 * request fills an empty slot with READY 0 (sequence_batch_scheduler.cc:1734-1768 at r24.10). */
TRITONSERVER_Error* new_factories(TRITONBACKEND_Request** requests, uint32_t count, std::vector<Slot>& slots) {
  for (uint32_t i = 0; i < count; ++i) {
    int32_t ready = 0;
    TRITONSERVER_Error* err = read_int32(requests[i], "READY", &ready);
    if (err != nullptr || ready == 0) { /* nobody waits for it: no response, released with ALL */
      drop(err);
      continue;
    }
    slots[i].kind = Kind::WAITING;
    err = TRITONBACKEND_ResponseFactoryNew(&slots[i].factory, requests[i]);
    if (err == nullptr) continue;
    for (uint32_t j = 0; j < i; ++j) {
      if (slots[j].factory != nullptr) drop(TRITONBACKEND_ResponseFactoryDelete(slots[j].factory));
      slots[j].factory = nullptr;
    }
    return err;
  }
  return nullptr;
}

/* Forget a sequence and give its blocks back to the pool. */
void forget(KvInstance* in, uint64_t id) {
  auto found = in->live.find(id);
  if (found == in->live.end()) return;
  in->pool.give(&found->second.blocks);
  in->live.erase(found);
}

/* Answer a request with one error, FINAL: it is refused (bad input, or it can never fit). */
void refuse(Slot* slot, TRITONSERVER_Error* err) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* made = TRITONBACKEND_ResponseNewFromFactory(&response, slot->factory);
  if (made == nullptr) {
    drop(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err)); /* takes the response */
  } else {
    drop(made);
    drop(TRITONBACKEND_ResponseFactorySendFlags(slot->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
  }
  drop(err);
  slot->kind = Kind::REFUSED;
}

/* Step 1 for one real request: a client's cancellation (TRITONBACKEND_RequestIsCancelled) frees its
 * blocks now; the iterative sequencer gives each request its correlation ID and START, and clears
 * the flags when it comes back rescheduled (core src/sequence_batch_scheduler/sequence_utils.cc:35-38
 * at r24.10): START or an ID we do not know begins a generation, any other continues one. */
void sort(KvInstance* in, TRITONBACKEND_Request* request, Slot* slot) {
  bool cancelled = false;
  uint32_t flags = 0;
  drop(TRITONBACKEND_RequestIsCancelled(request, &cancelled));
  TRITONSERVER_Error* err = TRITONBACKEND_RequestCorrelationId(request, &slot->id);
  if (err == nullptr) err = TRITONBACKEND_RequestFlags(request, &flags);
  if (err != nullptr || slot->id == 0) {
    refuse(slot, err != nullptr ? err : make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) +
                                                   ": a generation is keyed by an integer correlation ID: send none "
                                                   "(the iterative sequencer assigns one) or an unsigned integer"));
    return;
  }
  if (cancelled) {
    forget(in, slot->id);
    slot->kind = Kind::CANCELLED;
    return;
  }
  auto found = in->live.find(slot->id);
  if (found != in->live.end() && !(flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)) {
    slot->seq = &found->second;
    slot->kind = slot->seq->admitted ? Kind::DECODE : Kind::WAITING;
    return;
  }
  forget(in, slot->id); /* a client's ID used again: that sequence starts over */
  Sequence fresh;
  err = start(in, request, &fresh);
  if (err != nullptr) {
    refuse(slot, err);
    return;
  }
  slot->seq = &(in->live[slot->id] = std::move(fresh));
  slot->kind = Kind::WAITING;
}

/* A live sequence whose request is not in this execution is gone: with `direct`, every slot's
 * request is in every step (the next step is formed once the last execution completed and every
 * rescheduled request is back, sequence_batch_scheduler.cc:1583-1588, 1856-1866), so an absent one
 * was cancelled while it waited in its slot, which the batcher answers itself and never hands back
 * (1644-1656). Its blocks would leak: give them back. */
void reap(KvInstance* in, const std::vector<Slot>& slots) {
  std::vector<uint64_t> gone;
  for (const auto& entry : in->live) {
    bool present = false;
    for (const Slot& s : slots) present = present || (s.id == entry.first && s.kind != Kind::NUL);
    if (!present) gone.push_back(entry.first);
  }
  for (uint64_t id : gone) {
    LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": sequence " + std::to_string(id) +
                                   " is gone (cancelled in its slot): its blocks are freed");
    forget(in, id);
  }
}

/* ------------------------------------------------------------------ step 2: plan the memory */

/* Preempt the most recently admitted sequence that holds a cache: its blocks back to the pool; it
 * waits and, admitted again, prefills its prompt and every token it has generated (vLLM's recompute
 * preemption). The caller's slot for it becomes WAITING. */
void preempt_youngest(KvInstance* in, std::vector<Slot>& slots) {
  Slot* youngest = nullptr;
  for (Slot& s : slots) {
    if (s.kind == Kind::DECODE && (youngest == nullptr || s.seq->arrival > youngest->seq->arrival)) youngest = &s;
  }
  if (youngest == nullptr) return;
  in->pool.give(&youngest->seq->blocks);
  youngest->seq->admitted = false;
  youngest->seq->cached = 0;
  youngest->kind = Kind::WAITING;
}

/* Step 2a, paged: a running sequence whose last block is full gets a new one before its decode,
 * oldest first; when the pool is empty the youngest running sequence is preempted for it. */
void grow(KvInstance* in, std::vector<Slot>& slots) {
  const KvModel& m = *in->model;
  std::vector<Slot*> order;
  for (Slot& s : slots) {
    if (s.kind == Kind::DECODE) order.push_back(&s);
  }
  std::sort(order.begin(), order.end(), [](Slot* a, Slot* b) { return a->seq->arrival < b->seq->arrival; });
  for (Slot* s : order) {
    if (s->kind != Kind::DECODE || s->seq->cached < static_cast<int64_t>(s->seq->blocks.size()) * m.block_tokens) continue;
    while (in->pool.free == 0 && s->kind == Kind::DECODE) preempt_youngest(in, slots);
    if (s->kind == Kind::DECODE) s->seq->blocks.push_back(in->pool.take_any(1)[0]);
  }
}

/* Step 2b, ADMISSION BY MEMORY: waiting sequences in order of arrival, while their blocks are free:
 * paged, its prompt's (every token it has, after a preemption) plus one free for its first decode,
 * holding the former; contiguous, the maximum length's blocks in one run. The first that does not
 * fit stops admission (first come, first served: a long prompt is not starved by short ones); it and
 * those after it wait, released with RESCHEDULE, without a step or a response. */
void admit(KvInstance* in, std::vector<Slot>& slots) {
  const KvModel& m = *in->model;
  std::vector<Slot*> order;
  for (Slot& s : slots) {
    if (s.kind == Kind::WAITING) order.push_back(&s);
  }
  std::sort(order.begin(), order.end(), [](Slot* a, Slot* b) { return a->seq->arrival < b->seq->arrival; });
  for (Slot* s : order) {
    const int64_t n = static_cast<int64_t>(s->seq->tokens.size());
    if (m.layout == Layout::PAGED) {
      const int64_t hold = (n + m.block_tokens - 1) / m.block_tokens;
      if (in->pool.free < std::min(hold + 1, most_blocks(m, *s->seq))) return;
      s->seq->blocks = in->pool.take_any(hold);
    } else if (m.layout == Layout::CONTIGUOUS) {
      s->seq->blocks = in->pool.take_run(m.max_blocks());
      if (s->seq->blocks.empty()) return;
    }
    s->seq->admitted = true;
    s->kind = Kind::PREFILL;
  }
}

/* ------------------------------------------------------------------ step 3: forward */

/* Step 3: a prefill per admitted sequence, one batched decode over the running ones (recompute: a
 * full pass over each prefix, no cache). A libtorch exception fails this step's sequences, with its
 * words; none may cross into Triton. Returns how many sequences advanced. */
int32_t forward(KvInstance* in, std::vector<Slot>& slots) {
  const KvModel& m = *in->model;
  std::vector<Slot*> decodes;
  int32_t stepped = 0;
  try {
    for (Slot& s : slots) {
      if (s.kind == Kind::PREFILL) s.token = prefill(in, s.seq, m.layout != Layout::RECOMPUTE);
      else if (s.kind == Kind::DECODE && m.layout == Layout::RECOMPUTE) s.token = prefill(in, s.seq, false);
      else if (s.kind == Kind::DECODE) decodes.push_back(&s);
    }
    if (!decodes.empty()) {
      std::vector<Sequence*> batch;
      for (Slot* s : decodes) batch.push_back(s->seq);
      std::vector<int64_t> tokens = decode(in, batch);
      for (size_t i = 0; i < decodes.size(); ++i) decodes[i]->token = tokens[i];
    }
  } catch (const std::exception& ex) {
    const std::string why = m.where() + "PyTorch failed the step: " + torch_message(ex);
    for (Slot& s : slots) {
      if (s.kind != Kind::PREFILL && s.kind != Kind::DECODE) continue;
      forget(in, s.id);
      refuse(&s, make_error(TRITONSERVER_ERROR_INTERNAL, why));
    }
    return 0;
  }
  for (const Slot& s : slots) stepped += s.kind == Kind::PREFILL || s.kind == Kind::DECODE;
  return stepped;
}

/* Step 3b, optional: a step of a real LLM costs milliseconds, this model's a fraction of one; with
 * step_ms > 0 a step lasts at least that long (generate_iterative's stand-in cost, slept), so that a
 * test's requests, sent one by one, are all in flight long before any of them finishes. */
void pace(const KvModel& m, uint64_t compute_start) {
  if (m.step_ms <= 0) return;
  const uint64_t deadline = compute_start + static_cast<uint64_t>(m.step_ms) * 1000000ull;
  struct timespec until = {static_cast<time_t>(deadline / 1000000000ull), static_cast<long>(deadline % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
  }
}

/* ------------------------------------------------------------------ step 4: stream */

/* Whether the client asked for output `name` (all outputs when it named none). */
bool requested(TRITONBACKEND_Request* request, const char* name) {
  uint32_t count = 0;
  if (TRITONSERVER_Error* err = TRITONBACKEND_RequestOutputCount(request, &count)) {
    drop(err);
    return true;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const char* asked = nullptr;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestOutputName(request, i, &asked);
    if (err != nullptr) drop(err);
    else if (std::strcmp(asked, name) == 0) return true;
  }
  return false;
}

/* One output of shape [1, 1] (the batch dimension, then one element). */
TRITONSERVER_Error* add_output(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response, const char* name,
                               TRITONSERVER_DataType dtype, const void* data, uint64_t bytes) {
  if (!requested(request, name)) return nullptr;
  static const int64_t shape[2] = {1, 1};
  TRITONBACKEND_Output* output = nullptr;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, name, dtype, shape, 2));
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id));
  if (mem == TRITONSERVER_MEMORY_GPU) {
    return make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(BACKEND) + ": output buffer in GPU memory");
  }
  std::memcpy(buffer, data, bytes);
  return nullptr;
}

std::string bytes_element(const std::string& text) { /* BYTES: a 4-byte length, then the bytes */
  const uint32_t n = static_cast<uint32_t>(text.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + text;
}

/* Every output of one token's response, created before it is sent (tritonbackend.h:652-660 at r24.10). */
TRITONSERVER_Error* fill_outputs(const KvInstance& in, TRITONBACKEND_Request* request, TRITONBACKEND_Response* r,
                                 const Slot& s, int32_t step, int32_t batch) {
  const std::string text = bytes_element(std::string(1, in.model->w.vocabulary[s.token]));
  const std::string kind = bytes_element(s.kind == Kind::PREFILL ? "prefill" : "decode");
  const int32_t blocks = static_cast<int32_t>(s.seq->blocks.size()), free = static_cast<int32_t>(in.pool.free);
  RETURN_IF_ERROR(add_output(request, r, "TEXT", TRITONSERVER_TYPE_BYTES, text.data(), text.size()));
  RETURN_IF_ERROR(add_output(request, r, "STEP", TRITONSERVER_TYPE_INT32, &step, 4));
  RETURN_IF_ERROR(add_output(request, r, "KIND", TRITONSERVER_TYPE_BYTES, kind.data(), kind.size()));
  RETURN_IF_ERROR(add_output(request, r, "BATCH", TRITONSERVER_TYPE_INT32, &batch, 4));
  RETURN_IF_ERROR(add_output(request, r, "BLOCKS", TRITONSERVER_TYPE_INT32, &blocks, 4));
  return add_output(request, r, "FREE_BLOCKS", TRITONSERVER_TYPE_INT32, &free, 4);
}

/* Step 4 for one stepped sequence: a cancel that landed during the step frees its blocks and sends
 * nothing (the core answers it, see release); otherwise the token joins the sequence and is sent,
 * the last one with FINAL, the one flag that ends the client's stream, its blocks freed first so
 * that its FREE_BLOCKS already counts them. */
void stream(KvInstance* in, TRITONBACKEND_Request* request, Slot* s, int32_t batch) {
  bool cancelled = false;
  drop(TRITONBACKEND_RequestIsCancelled(request, &cancelled));
  if (cancelled) {
    forget(in, s->id);
    s->kind = Kind::CANCELLED;
    return;
  }
  const int32_t step = s->seq->generated++;
  s->seq->tokens.push_back(s->token);
  s->done = s->seq->generated >= s->seq->max_tokens;
  if (s->done) in->pool.give(&s->seq->blocks);
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNewFromFactory(&response, s->factory);
  if (err == nullptr) {
    err = fill_outputs(*in, request, response, *s, step, batch);
    if (err != nullptr) drop(TRITONBACKEND_ResponseDelete(response)); /* not sent: still ours */
  }
  /* Triton takes the response whatever ResponseSend returns (tritonbackend.h:757-759 at r24.10). */
  if (err == nullptr) err = TRITONBACKEND_ResponseSend(response, s->done ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, nullptr);
  if (err != nullptr) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, std::string(BACKEND) + ": sending a token failed: " + TRITONSERVER_ErrorMessage(err));
    drop(err);
    s->ok = false;
  }
  if (s->done || !s->ok) forget(in, s->id);
}

/* ------------------------------------------------------------------ step 5: release */

/* Step 5 for one request: statistics first (they need a request we still own: tritonbackend.h
 * 1336-1340 at r24.10), then the release. RESCHEDULE (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
 * tritonserver.h L966-991) puts the request back in its sequence slot's queue for the next step
 * (core src/sequence_batch_scheduler/sequence_utils.cc:35-38): an unfinished sequence, a waiting
 * one (no step, no response), and a cancelled one, which the batcher then finds cancelled, frees
 * its slot and answers CANCELLED (sequence_batch_scheduler.cc:1644-1656, 84-97); released with ALL
 * a cancelled request would end nothing (sequence_utils.cc:43). A finished, refused or failed
 * request ends with ALL, its FINAL flag sent if no token carried it; a null one with ALL. A failed
 * RESCHEDULE leaves the request ours (src/backend_model.cc:1346-1360): then it is ended instead.
 * Statistics count a step that computed (one success per token, as lab_iterative); a waiting,
 * cancelled or null request computed nothing and reports nothing. */
void release(KvInstance* in, TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, Slot* s,
             const uint64_t stamps[4]) {
  const bool stepped = s->kind == Kind::PREFILL || s->kind == Kind::DECODE;
  if (stepped) {
    drop(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, s->ok, stamps[0], stamps[1], stamps[2], stamps[3]));
  }
  bool reschedule = (stepped && s->ok && !s->done) || s->kind == Kind::WAITING || s->kind == Kind::CANCELLED;
  if (reschedule) {
    if (TRITONSERVER_Error* err = TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, std::string(BACKEND) + ": cannot reschedule: " + TRITONSERVER_ErrorMessage(err));
      drop(err);
      forget(in, s->id);
      s->ok = false;
      reschedule = false;
    }
  }
  if (!reschedule) {
    if (s->factory != nullptr && !(stepped && s->ok && s->done) && s->kind != Kind::REFUSED) {
      drop(TRITONBACKEND_ResponseFactorySendFlags(s->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    }
    drop(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  if (s->factory != nullptr) drop(TRITONBACKEND_ResponseFactoryDelete(s->factory)); /* our handle only */
}

}  // namespace

/* ------------------------------------------------------------------ entry points (C linkage) */
extern "C" {

/* Once, when the first model using this backend loads: the backend API this was written against. */
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  uint32_t major = 0, minor = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  return lab_fw::check_api_version(BACKEND, major, minor);
}

/* Once per model version: the config and the weights. The state is set last: Triton calls
 * ModelFinalize after a failed load too (core src/backend_model.cc:169-175, 983-987 at r24.10),
 * which then finds NULL while `m` frees what was made. */
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  auto m = std::make_unique<KvModel>();
  c10::InferenceMode guard;
  RETURN_IF_ERROR(read_config(model, m.get()));
  RETURN_IF_ERROR(load_weights(m.get()));
  RETURN_IF_ERROR(TRITONBACKEND_ModelSetState(model, m.get()));
  static const char* layouts[] = {"paged", "contiguous", "recompute"};
  LAB_LOG(TRITONSERVER_LOG_INFO, m->where() + m->model_file + ": " + std::to_string(m->w.layers.size()) + " layers, width " +
                                 std::to_string(m->w.width) + ", vocabulary " + std::to_string(m->w.vocabulary.size()) +
                                 "; " + std::to_string(m->slots) + " slots, kv_layout " + layouts[static_cast<int>(m->layout)] + ", " +
                                 std::to_string(m->kv_blocks) + " blocks of " + std::to_string(m->block_tokens) + " tokens");
  m.release(); /* Triton holds it now, until ModelFinalize */
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  return lab_fw::delete_model_state<KvModel>(model);
}

/* Once per instance: its KV pool, preallocated and zeroed. Each instance has its own sequence
 * batcher and slots (sequence_batch_scheduler.cc:160-174 at r24.10), so a sequence always comes
 * back to the same instance and its blocks. State set last (src/backend_model_instance.cc:305-311). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  auto in = std::make_unique<KvInstance>();
  RETURN_IF_ERROR(lab_fw::model_state_of(instance, &in->model));
  const KvModel& m = *in->model;
  if (m.threads > 0) at::set_num_threads(static_cast<int>(m.threads));
  const int64_t blocks = m.layout == Layout::RECOMPUTE ? 1 : m.kv_blocks; /* recompute keeps no K/V */
  try {
    for (size_t l = 0; l < m.w.layers.size(); ++l) {
      in->pool.layers.push_back(at::zeros({2, blocks, m.block_tokens, m.w.heads, HEAD_DIM}));
    }
  } catch (const std::exception& ex) {
    return make_error(TRITONSERVER_ERROR_INTERNAL, m.where() + "no memory for the KV pool: " + torch_message(ex));
  }
  in->pool.used.assign(static_cast<size_t>(m.kv_blocks), false);
  in->pool.free = m.kv_blocks;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceSetState(instance, in.get()));
  in.release();
  return nullptr;
}

/* The pool and every sequence go with the instance. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  return lab_fw::delete_instance_state<KvInstance>(instance);
}

/* One step of every sequence slot (or a null request for an empty one), formed only after the
 * previous step's execution returned (sequence_batch_scheduler.cc:1583-1588, 1856-1866 at r24.10).
 * Past step 0 every request is answered or rescheduled and released here, and this returns NULL. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  KvInstance* in = nullptr;
  RETURN_IF_ERROR(lab_fw::instance_state_of(instance, &in));
  std::vector<Slot> slots(count);
  RETURN_IF_ERROR(new_factories(requests, count, slots)); /* step 0: nothing sent yet */
  c10::InferenceMode guard;
  if (in->model->threads > 0 && at::get_num_threads() != in->model->threads) {
    at::set_num_threads(static_cast<int>(in->model->threads)); /* per thread, as lab_libtorch */
  }
  for (uint32_t i = 0; i < count; ++i) { /* step 1 */
    if (slots[i].kind != Kind::NUL) sort(in, requests[i], &slots[i]);
  }
  reap(in, slots);
  if (in->model->layout == Layout::PAGED) grow(in, slots); /* step 2 */
  admit(in, slots);
  stamps[1] = now_ns();
  const int32_t batch = forward(in, slots); /* step 3 */
  if (batch > 0) pace(*in->model, stamps[1]);
  stamps[2] = now_ns();
  for (uint32_t i = 0; i < count; ++i) { /* step 4 */
    if (slots[i].kind == Kind::PREFILL || slots[i].kind == Kind::DECODE) stream(in, requests[i], &slots[i], batch);
  }
  stamps[3] = now_ns();
  for (uint32_t i = 0; i < count; ++i) release(in, instance, requests[i], &slots[i], stamps); /* step 5 */
  if (batch > 0) {
    drop(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, static_cast<uint64_t>(batch), stamps[0], stamps[1],
                                                          stamps[2], stamps[3]));
  }
  return nullptr;
}

}  // extern "C"
