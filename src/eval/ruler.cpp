// RULER-style retrieval suite: deterministic prompt generator, answer scoring, the per-format driver and reports.
//
// Tasks follow RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?"):
// needle-in-a-haystack with number / uuid values, multiple keys with distractor needles, several values per key,
// several keys per question, variable tracking and common-words extraction. Templates and answer prefixes are
// RULER's; difficulty knobs are lowered for a 135M model (RulerDifficulty).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_map>

#include "kvpack/error.h"
#include "kvpack/eval.h"
#include "kvpack/progress.h"

namespace kvpack {
namespace {

constexpr std::array<RulerTask, 7> kTasks{RulerTask::niah_number,     RulerTask::niah_uuid,
                                          RulerTask::niah_multikey,   RulerTask::niah_multivalue,
                                          RulerTask::niah_multiquery, RulerTask::variable_tracking,
                                          RulerTask::common_words};
constexpr std::array<std::string_view, 7> kTaskNames{"niah_number",     "niah_uuid",         "niah_multikey",
                                                     "niah_multivalue", "niah_multiquery",   "variable_tracking",
                                                     "common_words"};

// Keys are "adjective-noun" pairs as in RULER's word keys.
constexpr std::array<std::string_view, 48> kAdjectives{
    "amber",  "brave",   "calm",   "daring", "eager",  "fancy",  "gentle", "happy",  "icy",    "jolly",
    "kind",   "lively",  "mellow", "noble",  "odd",    "proud",  "quick",  "rapid",  "silent", "tidy",
    "upbeat", "vivid",   "witty",  "young",  "zealous", "bold",  "crisp",  "dusty",  "early",  "faint",
    "giant",  "hollow",  "ivory",  "jagged", "keen",   "lucky",  "misty",  "narrow", "olive",  "plain",
    "quiet",  "rustic",  "sturdy", "tender", "urban",  "velvet", "wild",   "yellow"};
constexpr std::array<std::string_view, 48> kNouns{
    "anchor", "badger",  "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island", "jacket",
    "kettle", "lantern", "meadow", "needle",  "orchard", "pepper", "quartz", "river", "saddle", "tiger",
    "umbrella", "valley", "walrus", "yacht",  "zebra",  "bridge", "cactus", "desert", "feather", "glacier",
    "hammer", "igloo",   "jungle", "kitten",  "ladder", "marble", "nectar", "oyster", "pillow", "quiver",
    "rocket", "spider",  "tunnel", "violin",  "wagon",  "window", "basket", "comet"};

// Unbiased integer in [0, n) from a 64-bit engine: std::uniform_int_distribution differs between standard libraries,
// this does not (rejection of the top partial range, then modulo).
uint64_t below(std::mt19937_64& rng, uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}
double unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

template <typename T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {  // Fisher-Yates with our own sampling (std::shuffle isn't portable)
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(rng, i)]);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Prose sentences of a text: paragraphs split at ". ", "? ", "! "; headings and list fragments dropped.
std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find("\n\n", i);
    if (end == std::string::npos) end = text.size();
    std::string para;
    for (size_t j = i; j < end; ++j) {
      char c = text[j] == '\n' || text[j] == '\t' ? ' ' : text[j];
      if (c == ' ' && (para.empty() || para.back() == ' ')) continue;
      para += c;
    }
    size_t s = 0;
    for (size_t j = 0; j < para.size(); ++j) {
      const bool stop = (para[j] == '.' || para[j] == '?' || para[j] == '!') &&
                        (j + 1 == para.size() || para[j + 1] == ' ');
      if (!stop) continue;
      std::string sent = para.substr(s, j + 1 - s);
      while (!sent.empty() && sent.front() == ' ') sent.erase(sent.begin());
      const auto words = std::count(sent.begin(), sent.end(), ' ') + 1;
      // Keep prose: at least 6 words, starts with a capital letter, no digits-only numbering like "12.3.1."
      if (words >= 6 && sent.size() <= 600 && std::isupper(static_cast<unsigned char>(sent[0]))) out.push_back(sent);
      s = j + 2;
    }
    i = end + 2;
  }
  return out;
}

// Lower-case alphabetic words (4..10 letters) of a text, distinct, in order of first appearance.
std::vector<std::string> distinct_words(const std::string& text) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::string w;
  auto flush = [&] {
    if (w.size() >= 4 && w.size() <= 10 && seen.insert(w).second) out.push_back(w);
    w.clear();
  };
  for (char c : text) {
    if (std::isalpha(static_cast<unsigned char>(c)))
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else
      flush();
  }
  flush();
  return out;
}

std::string random_key(std::mt19937_64& rng, std::set<std::string>& used) {
  for (;;) {
    std::string k = fmt::format("{}-{}", kAdjectives[below(rng, kAdjectives.size())], kNouns[below(rng, kNouns.size())]);
    if (used.insert(k).second) return k;
  }
}
std::string random_number(std::mt19937_64& rng, std::set<std::string>& used) {
  for (;;) {
    std::string v = std::to_string(1000000 + below(rng, 9000000));  // 7 digits, as RULER
    if (used.insert(v).second) return v;
  }
}
std::string random_uuid(std::mt19937_64& rng) {
  const uint64_t a = rng(), b = rng();
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xffff, b >> 48,
                     b & 0xffffffffffffull);
}
std::string random_var(std::mt19937_64& rng, std::set<std::string>& used) {
  for (;;) {
    std::string v;
    for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + below(rng, 26));
    if (used.insert(v).second) return v;
  }
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? std::string(sep) : "") + v[i];
  return out;
}

// A sample as a function of its size knob n (haystack sentences, or filler words for common_words). Everything
// random is drawn from a generator seeded by the sample alone, so build(n) is pure and the search over n below is
// deterministic.
struct Built {
  std::string user, prefix, continuation;
  std::vector<std::string> gold;
};

struct Haystack {
  std::vector<std::string> sentences;
  std::vector<std::string> words;
};

// Haystack of n sentences starting at `start` (wrapping), with needles inserted at fractional depths (sorted).
std::string haystack_with_needles(const Haystack& h, size_t start, int n,
                                  const std::vector<std::pair<double, std::string>>& needles) {
  std::vector<std::string> parts;
  parts.reserve(static_cast<size_t>(n) + needles.size());
  for (int i = 0; i < n; ++i) parts.push_back(h.sentences[(start + static_cast<size_t>(i)) % h.sentences.size()]);
  // Insert deepest first so earlier insert positions stay valid.
  std::vector<std::pair<double, std::string>> sorted = needles;
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = sorted.size(); k-- > 0;) {
    const auto at = static_cast<size_t>(std::llround(sorted[k].first * n));
    parts.insert(parts.begin() + static_cast<long>(std::min<size_t>(at, static_cast<size_t>(n))), sorted[k].second);
  }
  return join(parts, " ");
}

Built build_sample(RulerTask task, const Haystack& h, uint64_t sample_seed, int n, const RulerDifficulty& d) {
  std::mt19937_64 rng(sample_seed);
  Built b;
  const size_t start = h.sentences.empty() ? 0 : below(rng, h.sentences.size());
  std::set<std::string> used;
  auto niah = [&](const std::string& kind_plural, const std::vector<std::pair<double, std::string>>& needles,
                  const std::string& question, std::string prefix) {
    b.user = fmt::format(
        "Some special magic {0} are hidden within the following text. Make sure to memorize it. I will quiz you "
        "about the {0} afterwards.\n{1}\n{2}",
        kind_plural, haystack_with_needles(h, start, n, needles), question);
    b.prefix = std::move(prefix);
  };
  auto needle = [](const std::string& kind, const std::string& key, const std::string& value) {
    return fmt::format("One of the special magic {} for {} is: {}.", kind, key, value);
  };
  switch (task) {
    case RulerTask::niah_number:
    case RulerTask::niah_uuid: {
      const bool uuid = task == RulerTask::niah_uuid;
      const std::string kind = uuid ? "uuids" : "numbers";
      const std::string key = random_key(rng, used);
      const std::string value = uuid ? random_uuid(rng) : random_number(rng, used);
      const double depth = unit(rng);
      niah(kind, {{depth, needle(kind, key, value)}},
           fmt::format("What is the special magic {} for {} mentioned in the provided text?", uuid ? "uuid" : "number", key),
           fmt::format("The special magic {} for {} mentioned in the provided text is", uuid ? "uuid" : "number", key));
      b.gold = {value};
      break;
    }
    case RulerTask::niah_multikey: {
      std::vector<std::pair<double, std::string>> needles;
      const std::string key = random_key(rng, used);
      const std::string value = random_number(rng, used);
      needles.push_back({unit(rng), needle("numbers", key, value)});
      for (int i = 0; i < d.multikey_distractors; ++i) {
        const std::string k = random_key(rng, used);
        needles.push_back({unit(rng), needle("numbers", k, random_number(rng, used))});
      }
      niah("numbers", needles, fmt::format("What is the special magic number for {} mentioned in the provided text?", key),
           fmt::format("The special magic number for {} mentioned in the provided text is", key));
      b.gold = {value};
      break;
    }
    case RulerTask::niah_multivalue: {
      const std::string key = random_key(rng, used);
      std::vector<std::pair<double, std::string>> needles, order;
      for (int i = 0; i < d.multivalue_values; ++i) {
        const std::string v = random_number(rng, used);
        const double depth = unit(rng);
        needles.push_back({depth, needle("numbers", key, v)});
        order.push_back({depth, v});
      }
      // Gold order: order of appearance in the context (what a reader would list).
      std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& c) { return a.first < c.first; });
      for (const auto& o : order) b.gold.push_back(o.second);
      niah("numbers", needles,
           fmt::format("What are all the special magic numbers for {} mentioned in the provided text?", key),
           fmt::format("The special magic numbers for {} mentioned in the provided text are", key));
      break;
    }
    case RulerTask::niah_multiquery: {
      std::vector<std::pair<double, std::string>> needles;
      std::vector<std::string> keys;
      for (int i = 0; i < d.multiquery_keys; ++i) {
        keys.push_back(random_key(rng, used));
        const std::string v = random_number(rng, used);
        b.gold.push_back(v);
        needles.push_back({unit(rng), needle("numbers", keys.back(), v)});
      }
      const std::string key_list = join(keys, ", ");
      niah("numbers", needles,
           fmt::format("What are all the special magic numbers for {} mentioned in the provided text?", key_list),
           fmt::format("The special magic numbers for {} mentioned in the provided text are", key_list));
      break;
    }
    case RulerTask::variable_tracking: {
      const std::string value = std::to_string(10000 + below(rng, 90000));
      std::vector<std::string> vars;
      for (int i = 0; i <= d.vt_hops; ++i) vars.push_back(random_var(rng, used));
      // The chain must be read in order: depths drawn, then sorted, so assignment i comes before i + 1.
      std::vector<double> depths;
      for (size_t i = 0; i < vars.size(); ++i) depths.push_back(unit(rng));
      std::sort(depths.begin(), depths.end());
      std::vector<std::pair<double, std::string>> needles;
      needles.push_back({depths[0], fmt::format("VAR {} = {}.", vars[0], value)});
      for (size_t i = 1; i < vars.size(); ++i)
        needles.push_back({depths[i], fmt::format("VAR {} = VAR {}.", vars[i], vars[i - 1])});
      b.user = fmt::format(
          "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{}\nQuestion: "
          "Find all variables that are assigned the value {} in the text above.",
          haystack_with_needles(h, start, n, needles), value);
      b.prefix = fmt::format(
          "Answer: According to the chain(s) of variable assignment in the text above, {} variables are assigned "
          "the value {}, they are:",
          vars.size(), value);
      b.gold = vars;
      b.continuation = " " + join(vars, " ");
      return b;
    }
    case RulerTask::common_words: {
      KVPACK_CHECK(h.words.size() >= static_cast<size_t>(d.cwe_top + 16),
                   "ruler: haystack text has only {} distinct words; common_words needs more", h.words.size());
      // Distinct words drawn without replacement: the first cwe_top are the common ones, n more are rare.
      std::vector<size_t> picks;
      std::set<size_t> taken;
      const size_t want = static_cast<size_t>(d.cwe_top) + static_cast<size_t>(std::max(n, 0));
      KVPACK_CHECK(want <= h.words.size(), "ruler: common_words needs {} distinct words, haystack has {}", want,
                   h.words.size());
      while (picks.size() < want) {
        const size_t k = below(rng, h.words.size());
        if (taken.insert(k).second) picks.push_back(k);
      }
      std::vector<std::string> list;
      for (size_t i = 0; i < picks.size(); ++i) {
        const int reps = i < static_cast<size_t>(d.cwe_top) ? d.cwe_freq_common : d.cwe_freq_rare;
        for (int r = 0; r < reps; ++r) list.push_back(h.words[picks[i]]);
      }
      shuffle(list, rng);
      std::string numbered;
      for (size_t i = 0; i < list.size(); ++i) numbered += fmt::format("{}{}. {}", i ? " " : "", i + 1, list[i]);
      // Gold order: first appearance in the list.
      std::vector<std::string> common;
      for (size_t i = 0; i < static_cast<size_t>(d.cwe_top); ++i) common.push_back(h.words[picks[i]]);
      std::vector<std::pair<size_t, std::string>> first;
      for (const auto& w : common)
        first.push_back({static_cast<size_t>(std::find(list.begin(), list.end(), w) - list.begin()), w});
      std::sort(first.begin(), first.end());
      for (const auto& f : first) b.gold.push_back(f.second);
      b.user = fmt::format(
          "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
          "that appear most often.\n{}\nQuestion: What are the {} most common words in the above list?",
          numbered, d.cwe_top);
      b.prefix = fmt::format("Answer: The top {} words that appear most often in the list are:", d.cwe_top);
      std::vector<std::string> numbered_gold;
      for (size_t i = 0; i < b.gold.size(); ++i) numbered_gold.push_back(fmt::format("{}. {}", i + 1, b.gold[i]));
      b.continuation = " " + join(numbered_gold, " ");
      return b;
    }
  }
  b.continuation = " " + join(b.gold, ", ");
  return b;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::span<const RulerTask> all_ruler_tasks() { return kTasks; }

std::string_view ruler_task_name(RulerTask t) { return kTaskNames.at(static_cast<size_t>(t)); }

std::vector<RulerTask> parse_ruler_tasks(std::string_view list) {
  if (list == "all") return {kTasks.begin(), kTasks.end()};
  std::vector<RulerTask> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view item = list.substr(start, end - start);
    if (!item.empty()) {
      auto it = std::find(kTaskNames.begin(), kTaskNames.end(), item);
      KVPACK_CHECK(it != kTaskNames.end(), "unknown ruler task '{}' (known: {})", item,
                   join(std::vector<std::string>(kTaskNames.begin(), kTaskNames.end()), ", "));
      out.push_back(kTasks[static_cast<size_t>(it - kTaskNames.begin())]);
    }
    start = end + 1;
  }
  KVPACK_CHECK(!out.empty(), "empty ruler task list '{}'", list);
  return out;
}

std::vector<RulerSample> generate_ruler(const std::vector<std::string>& haystack_texts,
                                        const std::vector<RulerTask>& tasks, const std::vector<int>& lengths,
                                        int samples, uint64_t seed, const PromptTokenCounter& count_tokens,
                                        const RulerDifficulty& difficulty, int answer_budget) {
  KVPACK_CHECK(!haystack_texts.empty(), "ruler: no haystack texts");
  KVPACK_CHECK(samples > 0, "ruler: --samples must be positive (got {})", samples);
  std::vector<Haystack> hay;
  for (size_t i = 0; i < haystack_texts.size(); ++i) {
    Haystack h{split_sentences(haystack_texts[i]), distinct_words(haystack_texts[i])};
    KVPACK_CHECK(h.sentences.size() >= 16, "ruler: haystack text {} has only {} prose sentences", i, h.sentences.size());
    hay.push_back(std::move(h));
  }
  std::vector<RulerSample> out;
  for (RulerTask task : tasks) {
    for (int length : lengths) {
      KVPACK_CHECK(length > answer_budget + 64, "ruler: length {} too short (answer budget {})", length, answer_budget);
      const int64_t budget = length - answer_budget;
      for (int i = 0; i < samples; ++i) {
        const Haystack& h = hay[static_cast<size_t>(i) % hay.size()];
        const uint64_t sseed = splitmix64(seed ^ splitmix64((static_cast<uint64_t>(task) << 48) ^
                                                            (static_cast<uint64_t>(length) << 20) ^
                                                            static_cast<uint64_t>(i)));
        auto tokens_at = [&](int n) {
          Built b = build_sample(task, h, sseed, n, difficulty);
          return std::pair{count_tokens(b.user, b.prefix), std::move(b)};
        };
        // Largest n whose prompt fits: secant steps from the per-item token cost, then exact +-1 steps.
        const int64_t base = tokens_at(0).first;
        KVPACK_CHECK(base <= budget, "ruler: task {} at length {}: the prompt without haystack already has {} tokens",
                     ruler_task_name(task), length, base);
        const int n_max = task == RulerTask::common_words
                              ? static_cast<int>(h.words.size()) - difficulty.cwe_top
                              : static_cast<int>(h.sentences.size());
        int n = std::min(n_max, 32);
        int64_t c = tokens_at(n).first;
        for (int iter = 0; iter < 6 && n > 0; ++iter) {
          const double per = static_cast<double>(c - base) / n;
          const int next = std::clamp(static_cast<int>(std::floor(static_cast<double>(budget - base) / std::max(per, 0.5))),
                                      1, n_max);
          if (next == n) break;
          n = next;
          c = tokens_at(n).first;
        }
        while (c > budget && n > 0) c = tokens_at(--n).first;
        while (n < n_max) {
          const int64_t up = tokens_at(n + 1).first;
          if (up > budget) break;
          ++n;
          c = up;
        }
        auto [count, b] = tokens_at(n);
        RulerSample s;
        s.task = task;
        s.length = length;
        s.index = i;
        s.user = std::move(b.user);
        s.answer_prefix = std::move(b.prefix);
        s.gold = std::move(b.gold);
        s.gold_continuation = std::move(b.continuation);
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

std::string normalize_answer(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

double answer_recall(const RulerSample& s, std::string_view answer) {
  if (s.gold.empty()) return 0;
  const std::string a = normalize_answer(answer);
  int found = 0;
  for (const auto& g : s.gold) {
    const std::string n = normalize_answer(g);
    // Whole-token containment: "1234567" must not count inside "12345678".
    for (size_t at = a.find(n); at != std::string::npos; at = a.find(n, at + 1)) {
      const bool left = at == 0 || !is_word_char(a[at - 1]);
      const bool right = at + n.size() == a.size() || !is_word_char(a[at + n.size()]);
      if (left && right) {
        ++found;
        break;
      }
    }
  }
  return static_cast<double>(found) / static_cast<double>(s.gold.size());
}

RulerResult run_ruler(RulerModel& model, const std::vector<RulerSample>& samples, const std::vector<Format>& formats_in,
                      const RulerConfig& cfg) {
  std::vector<Format> formats{Format::bf16};
  for (Format f : formats_in)
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  const int V = model.vocab_size();
  RulerResult r;
  Progress progress("ruler", static_cast<int64_t>(samples.size() * formats.size()), cfg.progress);
  int64_t done = 0;
  std::vector<float> ref;  // [k, V] bf16 log-probs of the gold span of the current sample
  std::vector<int> ref_arg;
  for (const RulerSample& s : samples) {
    const std::vector<int32_t> prompt = model.prompt_tokens(s);
    const std::vector<int32_t> gold = model.encode_continuation(s.gold_continuation);
    const size_t k = gold.size();
    KVPACK_CHECK(k > 0, "ruler: empty gold continuation for {} sample {}", ruler_task_name(s.task), s.index);
    ref.assign(k * static_cast<size_t>(V), 0.0f);
    ref_arg.assign(k, 0);
    for (Format f : formats) {
      RulerRecord rec;
      rec.task = s.task;
      rec.length = s.length;
      rec.index = s.index;
      rec.format = f;
      rec.prompt_tokens = static_cast<int>(prompt.size());
      rec.gold_tokens = static_cast<int>(k);
      size_t seen = 0;
      double kl = 0, nll = 0;
      auto on_gold = [&](int i, const float* logits) {
        KVPACK_CHECK(static_cast<size_t>(i) == seen && seen < k, "ruler: gold logits {} out of order", i);
        if (seen == 0) {
          float other = -INFINITY;
          for (int j = 0; j < V; ++j)
            if (j != gold[0]) other = std::max(other, logits[j]);
          rec.first_margin = static_cast<double>(logits[gold[0]]) - static_cast<double>(other);
        }
        float* row = ref.data() + seen * static_cast<size_t>(V);
        if (f == Format::bf16) {
          log_softmax(logits, V, row);
          ref_arg[seen] = argmax(row, V);
          nll += -static_cast<double>(row[gold[seen]]);
        } else {
          const PositionScore ps = score_position({row, ref_arg[seen]}, logits, V, gold[seen]);
          kl += ps.kl;
          nll += ps.nll_fmt;
        }
        ++seen;
      };
      const std::vector<int32_t> ans = model.answer(f, prompt, gold, cfg.max_new_tokens, on_gold);
      KVPACK_CHECK(seen == k, "ruler: model returned {} of {} gold positions", seen, k);
      rec.answer = model.decode(ans);
      rec.recall = answer_recall(s, rec.answer);
      rec.correct = rec.recall >= 1.0;
      rec.gold_kl = kl / static_cast<double>(k);
      rec.gold_nll = nll / static_cast<double>(k);
      r.records.push_back(std::move(rec));
      progress.update(++done, fmt::format("{} L={} #{}", ruler_task_name(s.task), s.length, s.index));
    }
  }
  progress.finish();
  r.seconds = progress.elapsed_s();
  std::set<int> lengths;
  for (const auto& s : samples) lengths.insert(s.length);
  r.lengths.assign(lengths.begin(), lengths.end());
  r.cells = summarize_ruler(r.records);
  return r;
}

std::vector<RulerCell> summarize_ruler(const std::vector<RulerRecord>& records) {
  // Group key: (task, length or 0 for all, format). Paired differences need bf16's outcome per sample.
  std::map<std::tuple<int, int, int>, bool> bf16_correct;  // (task, length, index)
  for (const auto& rec : records)
    if (rec.format == Format::bf16) bf16_correct[{static_cast<int>(rec.task), rec.length, rec.index}] = rec.correct;
  struct Acc {
    int n = 0;
    double correct = 0, recall = 0, kl = 0, nll = 0, d_sum = 0, d_sq = 0;
  };
  std::map<std::tuple<int, int, int>, Acc> acc;
  for (const auto& rec : records) {
    const auto it = bf16_correct.find({static_cast<int>(rec.task), rec.length, rec.index});
    const double d = it == bf16_correct.end() ? 0.0 : (rec.correct ? 1.0 : 0.0) - (it->second ? 1.0 : 0.0);
    for (int len : {rec.length, 0}) {
      Acc& a = acc[{static_cast<int>(rec.task), len, static_cast<int>(rec.format)}];
      ++a.n;
      a.correct += rec.correct ? 1 : 0;
      a.recall += rec.recall;
      a.kl += rec.gold_kl;
      a.nll += rec.gold_nll;
      a.d_sum += d;
      a.d_sq += d * d;
    }
  }
  std::vector<RulerCell> out;
  for (const auto& [key, a] : acc) {
    RulerCell c;
    c.task = static_cast<RulerTask>(std::get<0>(key));
    c.length = std::get<1>(key);
    c.format = static_cast<Format>(std::get<2>(key));
    c.n = a.n;
    const double n = a.n;
    c.accuracy = a.correct / n;
    c.stderr_acc = std::sqrt(c.accuracy * (1 - c.accuracy) / n);
    c.recall = a.recall / n;
    c.gold_kl = a.kl / n;
    c.gold_nll = a.nll / n;
    c.delta_vs_bf16 = a.d_sum / n;
    const double var = a.n > 1 ? (a.d_sq - a.d_sum * a.d_sum / n) / (n - 1) : 0.0;
    c.delta_se = std::sqrt(std::max(var, 0.0) / n);
    out.push_back(c);
  }
  return out;
}

nlohmann::json ruler_to_json(const RulerResult& r) {
  nlohmann::json j;
  j["seed"] = r.seed;
  j["samples"] = r.samples;
  j["lengths"] = r.lengths;
  j["seconds"] = r.seconds;
  nlohmann::json cells = nlohmann::json::array();
  for (const auto& c : r.cells)
    cells.push_back({{"task", ruler_task_name(c.task)},
                     {"length", c.length == 0 ? nlohmann::json("all") : nlohmann::json(c.length)},
                     {"format", format_name(c.format)},
                     {"bits_per_element", format_info(c.format).bits_per_element},
                     {"n", c.n},
                     {"accuracy", c.accuracy},
                     {"stderr", c.stderr_acc},
                     {"recall", c.recall},
                     {"gold_kl", c.gold_kl},
                     {"gold_nll", c.gold_nll},
                     {"delta_vs_bf16", c.delta_vs_bf16},
                     {"delta_se", c.delta_se}});
  j["cells"] = std::move(cells);
  nlohmann::json recs = nlohmann::json::array();
  for (const auto& x : r.records)
    recs.push_back({{"task", ruler_task_name(x.task)},
                    {"length", x.length},
                    {"index", x.index},
                    {"format", format_name(x.format)},
                    {"prompt_tokens", x.prompt_tokens},
                    {"answer", x.answer},
                    {"recall", x.recall},
                    {"correct", x.correct},
                    {"gold_kl", x.gold_kl},
                    {"gold_nll", x.gold_nll},
                    {"first_margin", x.first_margin},
                    {"gold_tokens", x.gold_tokens}});
  j["records"] = std::move(recs);
  return j;
}

std::string ruler_to_table(const RulerResult& r) {
  std::vector<Format> formats;
  std::vector<RulerTask> tasks;
  for (const auto& c : r.cells) {
    if (std::find(formats.begin(), formats.end(), c.format) == formats.end()) formats.push_back(c.format);
    if (std::find(tasks.begin(), tasks.end(), c.task) == tasks.end()) tasks.push_back(c.task);
  }
  std::sort(formats.begin(), formats.end());
  auto find = [&](RulerTask t, int len, Format f) -> const RulerCell* {
    for (const auto& c : r.cells)
      if (c.task == t && c.length == len && c.format == f) return &c;
    return nullptr;
  };
  std::string out;
  std::vector<int> lens = r.lengths;
  lens.push_back(0);
  for (int len : lens) {
    out += fmt::format("== exact-match accuracy (all gold values in the greedy answer) +- binomial s.e., {}\n",
                       len == 0 ? std::string("all lengths") : fmt::format("length {}", len));
    out += fmt::format("{:<18}", "task");
    for (Format f : formats) out += fmt::format(" {:>13}", format_name(f));
    out += "\n";
    for (RulerTask t : tasks) {
      out += fmt::format("{:<18}", ruler_task_name(t));
      for (Format f : formats) {
        const RulerCell* c = find(t, len, f);
        out += c ? fmt::format(" {:>6.3f}+-{:<5.3f}", c->accuracy, c->stderr_acc) : fmt::format(" {:>13}", "-");
      }
      out += "\n";
    }
  }
  out += "== all lengths: accuracy - bf16 (paired s.e.) | mean KL(bf16||fmt) on the gold answer span\n";
  out += fmt::format("{:<18}", "task");
  for (Format f : formats) out += fmt::format(" {:>22}", format_name(f));
  out += "\n";
  for (RulerTask t : tasks) {
    out += fmt::format("{:<18}", ruler_task_name(t));
    for (Format f : formats) {
      const RulerCell* c = find(t, 0, f);
      out += c ? fmt::format(" {:>+6.3f}({:.3f}) {:>9.2e}", c->delta_vs_bf16, c->delta_se, c->gold_kl)
               : fmt::format(" {:>22}", "-");
    }
    out += "\n";
  }
  return out;
}

}  // namespace kvpack
