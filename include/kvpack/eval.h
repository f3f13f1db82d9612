// Quality harness: teacher-forced comparison of every KV format against the bf16 cache (`kvpack eval`), and a
// RULER-style retrieval suite (`kvpack ruler`).
//
// The metrics and drivers here never touch the model directly: they talk to a small WindowLogits / RulerModel
// interface, so the statistics, the windowing and the prompt generator are unit-tested on synthetic logits and
// texts, and make_model_window_logits() / make_model_ruler() bind them to the CPU reference runner.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/formats.h"

namespace kvpack {

class LlamaModel;
class Calibration;

// ------------------------------------------------------------------------------------------------------------------
// Per-position metrics

// Log-softmax of logits[0..n) into out[0..n) with fp64 accumulation; returns log-sum-exp. out may alias logits.
double log_softmax(const float* logits, int n, float* out);

struct PositionScore {
  double kl = 0;        // KL(ref || fmt) = sum p_ref (log p_ref - log p_fmt), fp64 accumulation, clamped >= 0
  bool top1_match = false;  // argmax of ref == argmax of fmt (first index on ties)
  double nll_ref = 0;   // -log p_ref(target)
  double nll_fmt = 0;   // -log p_fmt(target)
};

// Precomputed reference distribution of one position: log-probs plus its argmax.
struct RefPosition {
  const float* logp = nullptr;  // [vocab] log-softmax of the reference logits
  int argmax = 0;
};
int argmax(const float* x, int n);

// Compares the format's raw logits against the reference log-probs. Two calls on bit-identical logits give KL 0
// exactly (both sides go through the same log_softmax). target may be -1 (no next token): nll fields are then 0.
PositionScore score_position(const RefPosition& ref, const float* fmt_logits, int vocab, int target);

// ------------------------------------------------------------------------------------------------------------------
// Aggregation

struct Stats {
  int64_t positions = 0;
  double kl_mean = 0, kl_p99 = 0, kl_max = 0;
  double top1_agreement = 1;  // fraction of positions whose argmax agrees with bf16
  double nll_mean = 0;        // mean NLL of the true next token under this format
  double delta_nll = 0;       // nll_mean - bf16's nll_mean over the same positions
  double ppl = 0;             // exp(nll_mean)
};

// Raw per-position records of one (format, text); statistics are computed from these at the end.
struct ScoreLog {
  std::vector<int32_t> pos;  // position inside its window
  std::vector<double> kl, nll_ref, nll_fmt;
  std::vector<uint8_t> top1;
  void add(int position, const PositionScore& s);
  void append(const ScoreLog& o);
  int64_t size() const { return static_cast<int64_t>(kl.size()); }
  // Statistics over positions with lo <= pos < hi (the whole log by default). p99 is the nearest-rank 99th
  // percentile (the smallest value with at least 99% of positions at or below it).
  Stats stats(int64_t lo = 0, int64_t hi = INT64_MAX) const;
};

// Nearest-rank quantile (q in [0,1]) of values; 0 for an empty input.
double quantile(std::vector<double> values, double q);

// Default report buckets [0,64), [64,512), [512,2k), [2k,4k), [4k,8k), ... cut at `window`.
std::vector<int64_t> default_bucket_edges(int64_t window);
// Power-of-two bins [0,1), [1,2), [2,4), ... up to window, for the KL-by-position plot.
std::vector<int64_t> plot_bin_edges(int64_t window);

// ------------------------------------------------------------------------------------------------------------------
// `kvpack eval`

// Teacher-forced logits of one window under one format. Implementations call cb(first_pos, n, logits[n*vocab]) for
// consecutive chunks covering every position of `tokens` in order.
class WindowLogits {
 public:
  virtual ~WindowLogits() = default;
  virtual int vocab_size() const = 0;
  virtual void run(Format f, std::span<const int32_t> tokens,
                   const std::function<void(int first_pos, int n, const float* logits)>& cb) = 0;
};

struct EvalText {
  std::string name;             // e.g. "eval-a"
  std::vector<int32_t> tokens;  // the whole tokenized text
};

struct EvalConfig {
  int window = 8192;             // tokens per window (the model's context by default)
  int64_t max_positions = 32768; // positions scored per text (fewer if the text is shorter)
  int bos_id = -1;               // >= 0: every window starts with this token (not scored as a target)
  bool progress = true;
};

struct FormatReport {
  Format format;
  double bits_per_element = 0;
  Stats all;
  std::vector<Stats> buckets;    // per EvalResult::bucket_edges
  std::vector<Stats> plot_bins;  // per EvalResult::plot_edges
};

struct TextReport {
  std::string text;  // text name, or "pooled"
  std::vector<FormatReport> formats;  // bf16 first, then the requested formats in order
};

struct EvalResult {
  int window = 0;
  std::vector<int64_t> bucket_edges, plot_edges;
  std::vector<TextReport> texts;  // one per text, then "pooled" when there is more than one text
  double seconds = 0;
};

// Scores every position of the first max_positions positions of each text in non-overlapping windows: the token at
// window position i is predicted from window positions <= i (each window is a fresh sequence; with bos_id the window
// is [BOS, t_s .. t_{s+W-2}]), the target is the next token of the text. bf16 runs once per window and its
// log-softmax is kept for the window; every format then runs the same window and is compared position by position.
EvalResult run_eval(WindowLogits& model, const std::vector<EvalText>& texts, const std::vector<Format>& formats,
                    const EvalConfig& cfg);

nlohmann::json eval_to_json(const EvalResult& r);
std::string eval_to_table(const EvalResult& r);
// KL (log scale) vs position for all formats of the pooled (or only) text, via gnuplot. Throws kvpack::Error with a
// clear message when gnuplot is not installed or fails.
void plot_eval(const EvalResult& r, const std::string& png_path);
// Throws the same clear error up front (before a long run) when gnuplot is missing.
void check_plotter();

// Which cache tensors a format quantises in the harness: both (the product), or only K or only V with the other kept
// in bf16 (a diagnostic: which half of a format costs the quality). Names "kv", "k", "v".
enum class QuantizedKinds : int { kv = 0, k, v };
QuantizedKinds parse_quantized_kinds(const std::string& s);  // throws kvpack::Error naming the bad value
const char* quantized_kinds_name(QuantizedKinds q);

// Binds WindowLogits to the reference runner: one LlamaSession per window and format, codecs from make_codec()
// (calib may be null for formats that need none). v_format (a design diagnostic, `kvpack eval --v-format`): every
// quantised row keeps its format for K and stores V in v_format instead (e.g. q4 keys with q3 values); bf16 stays the
// reference. Combined with kinds = k the V half stays bf16, with kinds = v the row's format is not used at all.
std::unique_ptr<WindowLogits> make_model_window_logits(const LlamaModel& model, const Calibration* calib,
                                                       QuantizedKinds kinds = QuantizedKinds::kv,
                                                       std::optional<Format> v_format = std::nullopt);

// ------------------------------------------------------------------------------------------------------------------
// RULER-style retrieval suite

enum class RulerTask : int { niah_number = 0, niah_uuid, niah_multikey, niah_multivalue, niah_multiquery,
                             variable_tracking, common_words };
std::span<const RulerTask> all_ruler_tasks();
std::string_view ruler_task_name(RulerTask t);
std::vector<RulerTask> parse_ruler_tasks(std::string_view list);  // "all" or comma list; throws on unknown names

// Difficulty knobs, calibrated for SmolLM2-135M (RULER's defaults are far beyond a 135M model).
struct RulerDifficulty {
  int multikey_distractors = 2;   // extra needles with other keys in niah_multikey
  int multivalue_values = 2;      // values for the one key in niah_multivalue
  int multiquery_keys = 2;        // keys asked at once in niah_multiquery
  int vt_hops = 2;                // assignments after the first in variable_tracking
  int cwe_top = 3;                // number of common words asked in common_words
  int cwe_freq_common = 12;       // occurrences of each common word
  int cwe_freq_rare = 2;          // occurrences of each other word
};

struct RulerSample {
  RulerTask task;
  int length = 0;       // target prompt length in tokens (prompt <= length)
  int index = 0;        // sample index within (task, length)
  std::string user;     // the user message (context + question)
  std::string answer_prefix;  // start of the assistant turn, e.g. "The special magic number for X is:"
  std::vector<std::string> gold;  // every value that must appear in the answer
  std::string gold_continuation;  // the gold answer text right after answer_prefix (teacher-forced span)
};

// Tokens of the full prompt (chat template + answer prefix) for a user message and answer prefix.
using PromptTokenCounter = std::function<int64_t(const std::string& user, const std::string& answer_prefix)>;

// Deterministic: the same haystack texts, seed, lengths, counts and counter give the same samples byte for byte
// (std::mt19937_64 with our own unbiased integer sampling). Haystacks are sentences of the held-out texts
// (haystack_texts[i % size] for sample i), needles are inserted at seeded depths, and each prompt is filled to at
// most `length` tokens minus `answer_budget` (room for the answer).
std::vector<RulerSample> generate_ruler(const std::vector<std::string>& haystack_texts,
                                        const std::vector<RulerTask>& tasks, const std::vector<int>& lengths,
                                        int samples, uint64_t seed, const PromptTokenCounter& count_tokens,
                                        const RulerDifficulty& difficulty = {}, int answer_budget = 64);

// Normalised for matching: lower case, runs of whitespace -> one space, trimmed.
std::string normalize_answer(std::string_view s);
// RULER's string_match_all: fraction of gold values contained in the normalised answer; a sample is correct when
// every gold value is present (1.0).
double answer_recall(const RulerSample& s, std::string_view answer);

// The model side of the suite, per format.
class RulerModel {
 public:
  virtual ~RulerModel() = default;
  virtual std::vector<int32_t> prompt_tokens(const RulerSample& s) const = 0;
  virtual std::vector<int32_t> encode_continuation(const std::string& text) const = 0;
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
  virtual int vocab_size() const = 0;
  // Greedy answer of `prompt` under format f (up to max_new tokens, stopping at end-of-generation or a newline);
  // also teacher-forces `gold` after the prompt and passes the logits of the positions predicting gold[0..k) to
  // gold_cb(i, logits) in order. Implementations share the prefill between the two when they can.
  virtual std::vector<int32_t> answer(Format f, std::span<const int32_t> prompt, std::span<const int32_t> gold,
                                      int max_new, const std::function<void(int i, const float* logits)>& gold_cb) = 0;
};

struct RulerRecord {
  RulerTask task;
  int length = 0, index = 0;
  Format format;
  int prompt_tokens = 0;
  std::string answer;
  double recall = 0;       // answer_recall
  bool correct = false;    // recall == 1
  double gold_kl = 0;      // mean KL(bf16 || fmt) over the gold span positions
  double gold_nll = 0;     // mean NLL of the gold tokens under this format
  // First answer token, teacher-forced: logit of the gold token minus the largest other logit (nats; > 0: greedy
  // decoding starts the answer right). Where bf16's margin is small, any perturbation of the cache can flip it.
  double first_margin = 0;
  int gold_tokens = 0;
};

struct RulerCell {  // one (task, length or all lengths, format)
  RulerTask task;
  int length = 0;  // 0 = all lengths
  Format format;
  int n = 0;
  double accuracy = 0, stderr_acc = 0;  // binomial standard error sqrt(p(1-p)/n)
  double recall = 0, gold_kl = 0, gold_nll = 0;
  // Paired with bf16 on the same samples: accuracy - bf16's accuracy, and its standard error (sd of the per-sample
  // difference / sqrt(n)); 0 for bf16 itself.
  double delta_vs_bf16 = 0, delta_se = 0;
};

struct RulerResult {
  uint64_t seed = 0;
  int samples = 0;
  std::vector<int> lengths;
  std::vector<RulerRecord> records;
  std::vector<RulerCell> cells;  // per (task, length, format) and per (task, all lengths, format)
  double seconds = 0;
};

struct RulerConfig {
  int max_new_tokens = 48;
  bool progress = true;
};

// Every format answers the same samples; bf16 always runs first (it is the KL reference).
RulerResult run_ruler(RulerModel& model, const std::vector<RulerSample>& samples, const std::vector<Format>& formats,
                      const RulerConfig& cfg);
std::vector<RulerCell> summarize_ruler(const std::vector<RulerRecord>& records);
nlohmann::json ruler_to_json(const RulerResult& r);
std::string ruler_to_table(const RulerResult& r);

std::unique_ptr<RulerModel> make_model_ruler(const LlamaModel& model, const Calibration* calib, int max_context,
                                             QuantizedKinds kinds = QuantizedKinds::kv);

}  // namespace kvpack
