// `dayzero verify --model DIR [--token-ids 1,2,3] [--kv-cache-dtype fp8|bf16] [--threads N]
// [--python PATH] [--tp T --ep E under mpirun]`: the layered comparison against the PyTorch
// reference (docs/models.md §8.1), also of a model split over ranks (docs/parallel.md §5).
// Runs python/dayzero_ref/verify_dump.py into a temporary folder, reads its taps, and prints one
// row per comparison (operator, layer, model level); the exit status is 1 if any row fails.

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/formats/npy.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/verify.h"
#include "dayzero/model/vision/vision_encoder.h"

extern char** environ;

namespace dz::cli {
namespace {

namespace fs = std::filesystem;

struct VerifyArgs {
  ModelArgs model;
  std::string token_ids;            // empty: the python side's default decisive prompt
  std::vector<std::string> images;  // image files, in the order of their placeholders
  std::string python = "/usr/bin/python3";
  // Debug (hidden): run the reference with another cache dtype than the engine's, or read an
  // existing dump instead of running python. The verification tests use them to break agreement.
  std::string reference_kv_cache_dtype;
  std::string reference_dump;
};

// Removes the folder when the command ends.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) fs::remove_all(path, ignored);
  }
};

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "cannot open {}", path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string python_path() {
  if (const char* env = std::getenv("DZ_PYTHONPATH"); env != nullptr && *env != '\0') return env;
  return std::string(DZ_SOURCE_DIR) + "/python";
}

// The KV cache dtype the model resolved ("auto" picks the recipe's default): the reference must
// simulate the same one.
std::string resolved_kv_cache_dtype(const model::CausalLm& model) {
  for (const model::LayerCacheSpec& spec : model.cache_layers())
    if (spec.mla.latent_dim > 0)
      return spec.mla.dtype == kernels::KvCacheDtype::kFp8 ? "fp8" : "bf16";
  return "bf16";
}

// python -m dayzero_ref.verify_dump MODEL OUT ..., with PYTHONPATH at the repository's python/.
Status run_reference_dump(const VerifyArgs& args, const std::string& kv_cache_dtype,
                          const std::string& out_dir) {
  const std::string pythonpath = python_path();
  if (!fs::exists(fs::path(pythonpath) / "dayzero_ref" / "verify_dump.py"))
    return make_error(StatusCode::kNotFound,
                      "cannot find dayzero_ref/verify_dump.py under {} (set DZ_PYTHONPATH to the "
                      "repository's python/ folder)",
                      pythonpath);
  std::vector<std::string> argv_s = {
      args.python,
      "-m",
      "dayzero_ref.verify_dump",
      args.model.model_dir,
      out_dir,
      "--kv-cache-dtype",
      args.reference_kv_cache_dtype.empty() ? kv_cache_dtype : args.reference_kv_cache_dtype,
      "--mxfp4-activations",
      args.model.mxfp4_activations};
  if (!args.token_ids.empty()) {
    argv_s.push_back("--token-ids");
    argv_s.push_back(args.token_ids);
  }
  for (const std::string& image : args.images) {
    argv_s.push_back("--image");
    argv_s.push_back(image);
  }
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) env_s.emplace_back(*e);
  env_s.push_back("PYTHONPATH=" + pythonpath);
  std::vector<char*> argv, envp;
  for (std::string& s : argv_s) argv.push_back(s.data());
  for (std::string& s : env_s) envp.push_back(s.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  const std::string stderr_path = out_dir + "/stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const int rc =
      posix_spawnp(&pid, args.python.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return make_error(StatusCode::kNotFound, "cannot run the reference: python '{}': {} (--python)",
                      args.python, std::strerror(rc));
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return Status::ok_status();
  Result<std::string> err = read_file(stderr_path);
  std::string text = err.ok() ? *err : std::string();
  if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
  if (text.find("No module named 'torch'") != std::string::npos ||
      text.find("No module named 'numpy'") != std::string::npos)
    return make_error(StatusCode::kUnsupported,
                      "the PyTorch reference needs torch and numpy, which '{}' lacks (choose an "
                      "interpreter with --python)",
                      args.python);
  return make_error(StatusCode::kInternal, "the reference dump failed (exit status {}):\n{}",
                    WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, text);
}

// L{layer}.{name}.npy and Lg.{name}.npy (layer −1) → TapMap.
Result<model::TapMap> read_taps(const fs::path& dir) {
  model::TapMap taps;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.size() < 6 || file[0] != 'L' || entry.path().extension() != ".npy") continue;
    const std::string stem = entry.path().stem().string();  // L3.attn_out
    const size_t dot = stem.find('.');
    if (dot == std::string::npos) continue;
    const std::string layer = stem.substr(1, dot - 1);
    int layer_id = -1;
    if (layer != "g") {
      try {
        layer_id = std::stoi(layer);
      } catch (const std::exception&) {
        continue;
      }
    }
    DZ_ASSIGN_OR_RETURN(std::string bytes, read_file(entry.path()));
    Result<formats::NpyF32> npy = formats::decode_npy_f32(bytes);
    if (!npy.ok()) return npy.status().with_context(entry.path().string());
    taps[{layer_id, stem.substr(dot + 1)}] = {npy->shape, std::move(npy->data)};
  }
  if (ec)
    return make_error(StatusCode::kNotFound, "cannot list {}: {}", dir.string(), ec.message());
  return taps;
}

// Under a plan rank 0 alone runs the reference; its token ids and taps (or its error) reach every
// rank as one broadcast: an ok flag, the ids, then per tap its layer, name, shape and values.
class Packer {
 public:
  template <typename T>
  void put(const T& value) {
    const auto* bytes = reinterpret_cast<const std::byte*>(&value);
    data.insert(data.end(), bytes, bytes + sizeof(T));
  }
  template <typename T>
  void put_all(std::span<const T> values) {
    put(static_cast<int64_t>(values.size()));
    const auto bytes = std::as_bytes(values);
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  std::vector<std::byte> data;
};

class Unpacker {
 public:
  explicit Unpacker(std::span<const std::byte> data) : data_(data) {}
  template <typename T>
  T take() {
    T value;
    DZ_CHECK(at_ + sizeof(T) <= data_.size(), "verify: the reference message ends early");
    std::memcpy(&value, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <typename T>
  std::vector<T> take_all() {
    const auto count = static_cast<size_t>(take<int64_t>());
    DZ_CHECK(at_ + count * sizeof(T) <= data_.size(), "verify: the reference message ends early");
    std::vector<T> values(count);
    std::memcpy(values.data(), data_.data() + at_, count * sizeof(T));
    at_ += count * sizeof(T);
    return values;
  }

 private:
  std::span<const std::byte> data_;
  size_t at_ = 0;
};

struct Reference {
  std::vector<int32_t> ids;
  model::TapMap taps;
};

Result<Reference> share_reference(dist::Comm& comm, Result<Reference> mine) {
  Packer out;
  if (comm.rank() == 0) {
    out.put(static_cast<int64_t>(mine.ok()));
    if (!mine.ok()) {
      const std::string text = mine.status().to_string();
      out.put_all(std::span(text.data(), text.size()));
    } else {
      out.put_all(std::span<const int32_t>(mine->ids));
      out.put(static_cast<int64_t>(mine->taps.size()));
      for (const auto& [key, tap] : mine->taps) {
        out.put(static_cast<int64_t>(key.first));
        out.put_all(std::span(key.second.data(), key.second.size()));
        out.put(static_cast<int64_t>(tap.shape.rank()));
        for (int axis = 0; axis < tap.shape.rank(); ++axis) out.put(tap.shape[axis]);
        out.put_all(std::span<const float>(tap.data));
      }
    }
  }
  auto size = static_cast<int64_t>(out.data.size());
  comm.broadcast(std::as_writable_bytes(std::span(&size, 1)), 0, -1);
  out.data.resize(static_cast<size_t>(size));
  comm.broadcast(std::span(out.data), 0, -1);
  if (comm.rank() == 0) return mine;
  Unpacker in(out.data);
  if (in.take<int64_t>() == 0) {
    const std::vector<char> text = in.take_all<char>();
    return make_error(StatusCode::kInternal, "rank {}: rank 0 could not run the reference: {}",
                      comm.rank(), std::string(text.begin(), text.end()));
  }
  Reference ref;
  ref.ids = in.take_all<int32_t>();
  const auto num_taps = in.take<int64_t>();
  for (int64_t i = 0; i < num_taps; ++i) {
    const auto layer = static_cast<int>(in.take<int64_t>());
    const std::vector<char> name = in.take_all<char>();
    Shape shape;
    const auto rank = static_cast<int>(in.take<int64_t>());
    DZ_CHECK(rank >= 0 && rank <= kMaxRank, "verify: a reference tap of rank {}", rank);
    for (int axis = 0; axis < rank; ++axis) shape.push_back(in.take<int64_t>());
    ref.taps[{layer, std::string(name.begin(), name.end())}] = {shape, in.take_all<float>()};
  }
  return ref;
}

std::string format_row(const model::VerifyRow& r) {
  const bool count = r.metric.find("beyond") != std::string::npos;
  const std::string value =
      count ? fmt::format("{}", static_cast<int64_t>(r.value)) : fmt::format("{:.3e}", r.value);
  const std::string op = r.at_least ? ">=" : (count ? "<=" : "<");
  const std::string tol = fmt::format("{} {:g}", op, r.tolerance);
  return fmt::format("{:<9} {:>5} {:<20} {:<18} {:>10} {:>9} {}", r.level,
                     r.layer_id < 0 ? std::string("-") : std::to_string(r.layer_id), r.quantity,
                     r.metric, value, tol, r.pass ? "PASS" : "FAIL");
}

// Rank 0's reference: the dump (run here, or the one given) read back.
Result<Reference> run_reference(const VerifyArgs& args, const std::string& kv_cache_dtype) {
  TempDir tmp;
  fs::path dump_dir = args.reference_dump;
  if (dump_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "dayzero-verify-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr)
      return make_error(StatusCode::kInternal, "cannot create a temporary folder: {}",
                        std::strerror(errno));
    tmp.path = dump_dir = pattern;
    DZ_RETURN_IF_ERROR(run_reference_dump(args, kv_cache_dtype, dump_dir.string()));
  }
  DZ_ASSIGN_OR_RETURN(std::string ids_json, read_file(dump_dir / "token_ids.json"));
  std::string list;
  for (char ch : ids_json)
    if (ch != '[' && ch != ']' && ch != ' ' && ch != '\n') list.push_back(ch);
  Reference ref;
  DZ_ASSIGN_OR_RETURN(ref.ids, parse_token_ids(list, "token_ids.json"));
  DZ_ASSIGN_OR_RETURN(ref.taps, read_taps(dump_dir));
  return ref;
}

// The engine's preprocessing of the --image files.
Result<std::vector<model::ProcessedImage>> process_images(const VerifyArgs& args,
                                                          const model::CausalLm& model) {
  std::vector<model::ProcessedImage> images;
  for (const std::string& path : args.images) {
    DZ_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
    Result<model::ProcessedImage> image = model.vision()->process(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (!image.ok()) return image.status().with_context("--image " + path);
    images.push_back(std::move(*image));
  }
  return images;
}

Result<int> run(const VerifyArgs& args) {
  // Under a plan every rank runs the comparisons on its own shard, in step (model/verify.h).
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_shard(args.model));
  auto* hybrid = dynamic_cast<model::HybridModel*>(model.get());
  if (hybrid == nullptr)
    return make_error(StatusCode::kUnsupported, "verify: {} is not a model verify knows",
                      args.model.model_dir);
  const std::string kv_cache_dtype = resolved_kv_cache_dtype(*model);
  if (!args.token_ids.empty()) {
    DZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_token_ids(args.token_ids, "--token-ids"));
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= model->vocab_size())
        return make_error(StatusCode::kInvalidArgument,
                          "--token-ids: id {} (index {}) is outside the vocabulary [0, {})", ids[i],
                          i, model->vocab_size());
  }
  dist::Comm* comm = plan_comm();
  if (!args.images.empty() && model->vision() == nullptr)
    return make_error(StatusCode::kInvalidArgument, "--image: {} has no vision tower",
                      args.model.model_dir);
  if (!args.images.empty() && comm != nullptr)
    return make_error(StatusCode::kUnsupported, "--image is verified in one process only");
  const bool leads = comm == nullptr || comm->rank() == 0;
  Result<Reference> mine = leads ? run_reference(args, kv_cache_dtype) : Reference{};
  DZ_ASSIGN_OR_RETURN(const Reference ref,
                      comm != nullptr ? share_reference(*comm, std::move(mine)) : std::move(mine));

  const ExecContext ctx = exec_context(args.model);
  std::vector<model::VerifyRow> rows;
  std::vector<float> embeddings;  // the engine's image embeddings, in placeholder order
  std::vector<model::GivenEmbedding> given;
  if (!args.images.empty()) {
    DZ_ASSIGN_OR_RETURN(std::vector<model::ProcessedImage> images, process_images(args, *model));
    DZ_ASSIGN_OR_RETURN(rows,
                        model::verify_vision(ctx, *model->vision(), images, ref.taps, embeddings));
    const int64_t hidden = model->hidden_size();
    for (size_t t = 0; t < ref.ids.size(); ++t)
      if (ref.ids[t] == model->vision()->placeholder_token_id())
        given.push_back({.token = static_cast<int64_t>(t),
                         .row = embeddings.data() + static_cast<int64_t>(given.size()) * hidden});
    if (static_cast<int64_t>(given.size()) * hidden != static_cast<int64_t>(embeddings.size()))
      return make_error(StatusCode::kInvalidArgument,
                        "verify: the prompt holds {} image placeholders, the images need {}",
                        given.size(), static_cast<int64_t>(embeddings.size()) / hidden);
  }
  DZ_ASSIGN_OR_RETURN(
      std::vector<model::VerifyRow> text_rows,
      model::verify_model(ctx, *hybrid, ref.ids, ref.taps, args.model.block_size, given));
  rows.insert(rows.end(), text_rows.begin(), text_rows.end());
  if (comm != nullptr) rows = model::worst_over_ranks(*comm, std::move(rows));
  int64_t failed = 0;
  for (const model::VerifyRow& r : rows) failed += r.pass ? 0 : 1;
  if (!leads) return failed == 0 ? 0 : 1;
  std::printf("verify %s: %zu tokens, kv cache %s%s\n", args.model.model_dir.c_str(),
              ref.ids.size(), kv_cache_dtype.c_str(),
              comm != nullptr ? ", worst rank of each row" : "");
  std::printf("%-9s %5s %-20s %-18s %10s %9s %s\n", "level", "layer", "quantity", "metric", "value",
              "tolerance", "result");
  for (const model::VerifyRow& r : rows) std::printf("%s\n", format_row(r).c_str());
  std::printf("%zu rows, %lld failed\n", rows.size(), static_cast<long long>(failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace

RunCommand add_verify_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "verify", "Compare every layer with the PyTorch reference (operator, layer, model level)");
  auto args = std::make_shared<VerifyArgs>();
  add_model_options(*command, args->model);
  add_parallel_options(*command, args->model.parallel);
  command->add_option("--token-ids", args->token_ids,
                      "comma-separated token ids (default: the reference's decisive test prompt)");
  command->add_option("--image", args->images,
                      "an image file for the vision tower (repeatable; the prompt must hold its "
                      "placeholders, or by default each image's come first)");
  command->add_option("--python", args->python, "interpreter with torch and numpy")
      ->capture_default_str();
  command->add_option("--reference-kv-cache-dtype", args->reference_kv_cache_dtype)
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->group("");
  command->add_option("--reference-dump", args->reference_dump)->group("");
  return [args] {
    Result<int> rc = run(*args);
    return rc.ok() ? *rc : fail(rc.status());
  };
}

}  // namespace dz::cli
