// The torch-free checkpoint format: tensor files, manifests, the folder rules
// of Note [checkpoint atomicity], and writing trained weights into ONNX.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "executor/checkpoint/checkpoint_dir.h"
#include "executor/checkpoint/onnx_export.h"
#include "executor/checkpoint/tensor_file.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::checkpoint {
namespace {
namespace fs = std::filesystem;

ir::Tensor f32(std::vector<int64_t> dims, std::vector<float> values) {
  ir::Tensor t;
  t.dtype = ir::DType::F32;
  t.dims = std::move(dims);
  t.data.assign(reinterpret_cast<const char *>(values.data()), values.size() * sizeof(float));
  return t;
}

/// A fresh, empty scratch folder per test.
std::string scratch(const std::string &name) {
  fs::path p = fs::temp_directory_path() / ("rannc_checkpoint_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void writeText(const std::string &path, const std::string &text) { std::ofstream(path, std::ios::binary) << text; }

TEST(TensorFile, RoundTripKeepsBytesShapesAndMetadata) {
  ir::Tensor ids;
  ids.dtype = ir::DType::I64;
  ids.dims = {3};
  int64_t v[3] = {1, -2, 1LL << 40};
  ids.data.assign(reinterpret_cast<const char *>(v), sizeof v);
  std::string blob = encodeTensors({{"w", f32({2, 2}, {1, 2, 3, 4})}, {"ids", ids}}, {{"step", "7"}});
  // safetensors: u64 header length, then the JSON header padded to 8 bytes.
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(blob.size(), 8 + n + 16 + 24); // 4 floats + 3 int64s
  auto f = decodeTensors(blob, "x.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->metadata.at("step"), "7");
  EXPECT_EQ(f->tensors.at("w").dims, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f->tensors.at("w").data, f32({2, 2}, {1, 2, 3, 4}).data);
  EXPECT_EQ(f->tensors.at("ids").dtype, ir::DType::I64);
  EXPECT_EQ(f->tensors.at("ids").data, ids.data);
}

TEST(TensorFile, DamagedBlobsAreErrorsNotCrashes) {
  std::string blob = encodeTensors({{"w", f32({2, 2}, {1, 2, 3, 4})}});
  for (size_t len = 0; len < blob.size(); ++len) {
    auto f = decodeTensors(blob.substr(0, len), "cut.safetensors");
    EXPECT_FALSE(f.ok()) << "a blob cut to " << len << " bytes decoded";
    if (!f.ok()) {
      EXPECT_NE(f.error().message.find("cut.safetensors"), std::string::npos);
    }
  }
  auto header = [](const std::string &json, size_t data_bytes) {
    std::string out(8, '\0');
    uint64_t n = json.size();
    std::memcpy(out.data(), &n, 8);
    return out + json + std::string(data_bytes, '\0');
  };
  auto bad = decodeTensors(header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 16), "a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("holds 16 bytes, its shape needs 8"), std::string::npos) << bad.error().message;
  bad = decodeTensors(header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8), "a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("outside"), std::string::npos) << bad.error().message;
  bad = decodeTensors(header(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8), "a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("unsupported dtype"), std::string::npos);
  bad = decodeTensors(header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             12),
                      "a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("overlap"), std::string::npos);
}

Manifest sampleManifest() {
  Manifest m;
  m.step = 6;
  m.samples_consumed = 48;
  m.epoch = 0;
  m.dataset_samples = 64;
  m.samples_per_step = 8;
  m.shuffle = "on";
  m.seed = 3;
  m.optimizer = "adam";
  m.lr = 0.001;
  m.model_path = "/m/model.onnx";
  m.model_sha256 = std::string(64, 'a');
  m.world_size = 2;
  m.stages = {{0, 10, {0}}, {10, 20, {1}}};
  m.files = {{"stage-0.safetensors", 40, std::string(64, 'b')}};
  m.parameters = {{"w", "stage-0.safetensors"}};
  return m;
}

TEST(Manifest, RoundTrip) {
  Manifest m = sampleManifest();
  auto back = parseManifest(manifestToJson(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(manifestToJson(*back), manifestToJson(m));
  EXPECT_EQ(back->stages, m.stages);
  EXPECT_EQ(back->parameters, m.parameters);
}

// fp16's loss scaler travels in the manifest (GradScaler.state_dict's keys);
// a manifest without it (fp32/bf16, or written before it was saved) parses
// with none.
TEST(Manifest, LossScaleRoundTripsAndIsOptional) {
  Manifest m = sampleManifest();
  auto none = parseManifest(manifestToJson(m), "mf");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->loss_scale.has_value());
  EXPECT_EQ(manifestToJson(m).find("loss_scale"), std::string::npos);

  m.loss_scale = LossScaleState{2097152.0, 2.0, 0.5, 2000, 17};
  auto back = parseManifest(manifestToJson(m), "mf");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back->loss_scale.has_value());
  EXPECT_EQ(back->loss_scale->scale, 2097152.0);
  EXPECT_EQ(back->loss_scale->growth_factor, 2.0);
  EXPECT_EQ(back->loss_scale->backoff_factor, 0.5);
  EXPECT_EQ(back->loss_scale->growth_interval, 2000);
  EXPECT_EQ(back->loss_scale->growth_tracker, 17);
  EXPECT_EQ(manifestToJson(*back), manifestToJson(m));

  for (auto bad : {LossScaleState{0.0, 2.0, 0.5, 2000, 0}, LossScaleState{1.0, 2.0, 0.5, 2000, 2000},
                   LossScaleState{1.0, 2.0, 0.5, 0, 0}, LossScaleState{1.0, -2.0, 0.5, 2000, 0}}) {
    m.loss_scale = bad;
    auto refused = parseManifest(manifestToJson(m), "mf");
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("mf: corrupt manifest: loss_scale"), std::string::npos)
        << refused.error().message;
  }
}

TEST(Manifest, CorruptOnesAreErrors) {
  std::string good = manifestToJson(sampleManifest());
  for (size_t len : {size_t(0), size_t(1), good.size() / 2, good.size() - 3}) {
    auto m = parseManifest(good.substr(0, len), "D/step-6/manifest.json");
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("D/step-6/manifest.json: corrupt manifest"), std::string::npos)
        << m.error().message;
  }
  Manifest unlisted = sampleManifest();
  unlisted.parameters["v"] = "stage-1.safetensors";
  auto m = parseManifest(manifestToJson(unlisted), "mf");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("parameter 'v' is in 'stage-1.safetensors', which is not in files"),
            std::string::npos);
  Manifest escaping = sampleManifest();
  escaping.files[0].name = "../../etc/passwd";
  escaping.parameters["w"] = escaping.files[0].name;
  EXPECT_FALSE(parseManifest(manifestToJson(escaping), "mf").ok());
  std::string other_version = good;
  other_version.replace(other_version.find("\"version\": 1"), 12, "\"version\": 9");
  m = parseManifest(other_version, "mf");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("format version 9"), std::string::npos);
}

/// Writes a complete checkpoint of `step` with one tensor file.
void writeCheckpoint(const std::string &root, int64_t step) {
  const std::string dir = root + "/" + stepFolderName(step);
  fs::create_directories(dir);
  std::string blob = encodeTensors({{"w", f32({2}, {float(step), 1})}});
  writeText(dir + "/stage-0.safetensors", blob);
  Manifest m = sampleManifest();
  m.step = step;
  m.files = {{"stage-0.safetensors", int64_t(blob.size()), sha256Hex(blob)}};
  writeText(dir + "/manifest.json", manifestToJson(m));
}

TEST(Folder, NewestCompleteCheckpointSkipsPartialOnes) {
  const std::string root = scratch("latest");
  writeCheckpoint(root, 3);
  writeCheckpoint(root, 12);
  // A write killed before the rename, and a step folder whose manifest is gone.
  fs::create_directories(root + "/step-20.tmp");
  writeText(root + "/step-20.tmp/stage-0.safetensors", "partial");
  writeCheckpoint(root, 15);
  fs::remove(root + "/step-15/manifest.json");
  std::vector<std::string> skipped;
  auto found = findLatest(root, &skipped);
  ASSERT_TRUE(found.ok()) << found.error().message;
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->manifest.step, 12); // numeric order: 12 > 3, though "12" < "3"
  EXPECT_EQ(skipped, std::vector<std::string>{root + "/step-15"});

  auto weights = readWeights(**found);
  ASSERT_TRUE(weights.ok()) << weights.error().message;
  EXPECT_EQ(weights->at("w").data, f32({2}, {12, 1}).data);

  // A damaged file is caught by its SHA-256.
  std::string path = root + "/step-12/stage-0.safetensors";
  std::string bytes = *readFile(path);
  bytes[bytes.size() - 1] ^= 1;
  writeText(path, bytes);
  auto damaged = readWeights(**found);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.error().message.find("SHA-256 differs"), std::string::npos);

  // A manifest that no longer parses in the newest folder is an error, not a silent fallback.
  writeText(root + "/step-12/manifest.json", "{\"format\": \"rannc-che");
  auto corrupt = findLatest(root);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.error().message.find("step-12/manifest.json: corrupt manifest"), std::string::npos);

  auto missing = findLatest(root + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no such checkpoint folder"), std::string::npos);
  fs::remove_all(root);
}

TEST(Folder, OpenTakesACheckpointOrAFolderOfThem) {
  const std::string root = scratch("open");
  writeCheckpoint(root, 4);
  writeCheckpoint(root, 8);
  EXPECT_EQ(openCheckpoint(root)->manifest.step, 8);
  EXPECT_EQ(openCheckpoint(root + "/step-4/")->manifest.step, 4);
  fs::create_directories(root + "/empty");
  auto none = openCheckpoint(root + "/empty");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("holds no complete checkpoint"), std::string::npos);
  fs::remove_all(root);
}

TEST(Folder, PublishAndPrune) {
  const std::string root = scratch("prune");
  for (int64_t s : {2, 4, 6}) writeCheckpoint(root, s);
  fs::create_directories(root + "/step-1.tmp"); // abandoned by a crash
  // Step 8, written into its .tmp folder, then published.
  writeCheckpoint(root + "/staging", 8);
  fs::rename(root + "/staging/step-8", root + "/step-8.tmp");
  ASSERT_TRUE(publish(root + "/step-8.tmp", root + "/step-8").ok());
  EXPECT_TRUE(fs::exists(root + "/step-8/manifest.json"));
  EXPECT_FALSE(fs::exists(root + "/step-8.tmp"));
  auto deleted = prune(root, 2);
  ASSERT_TRUE(deleted.ok()) << deleted.error().message;
  EXPECT_EQ(deleted->size(), 3u); // step-2, step-4 and the abandoned step-1.tmp
  EXPECT_FALSE(fs::exists(root + "/step-2"));
  EXPECT_FALSE(fs::exists(root + "/step-4"));
  EXPECT_FALSE(fs::exists(root + "/step-1.tmp"));
  EXPECT_TRUE(fs::exists(root + "/step-6/manifest.json"));
  EXPECT_TRUE(fs::exists(root + "/step-8/manifest.json"));
  // Replacing a checkpoint of the same step (a run resumed from before it).
  fs::create_directories(root + "/step-8.tmp");
  writeText(root + "/step-8.tmp/marker", "new");
  ASSERT_TRUE(publish(root + "/step-8.tmp", root + "/step-8").ok());
  EXPECT_TRUE(fs::exists(root + "/step-8/marker"));
  fs::remove_all(root);
}

// Note [hostile inputs]: a FIFO or /dev/zero as manifest.json or as a tensor
// file is refused at once (no hang, no unbounded read), and a file larger
// than the manifest says is refused before it is read.
TEST(Folder, RefusesFilesThatAreNotRegularOrTooLarge) {
  const std::string root = scratch("hostile");
  writeCheckpoint(root, 5);
  const std::string dir = root + "/step-5";
  fs::remove(dir + "/stage-0.safetensors");
  fs::create_symlink("/dev/zero", dir + "/stage-0.safetensors");
  auto found = openCheckpoint(dir);
  ASSERT_TRUE(found.ok()) << found.error().message;
  auto zero = readWeights(*found);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("not a regular file"), std::string::npos) << zero.error().message;
  fs::remove(dir + "/stage-0.safetensors");
  writeText(dir + "/stage-0.safetensors", std::string(4096, 'x')); // larger than the manifest's bytes
  auto big = readWeights(*found);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("more than the"), std::string::npos) << big.error().message;

  fs::remove(dir + "/manifest.json");
  ASSERT_EQ(::mkfifo((dir + "/manifest.json").c_str(), 0600), 0);
  auto fifo = openCheckpoint(dir);
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.error().message.find("a FIFO, not a regular file"), std::string::npos) << fifo.error().message;
  EXPECT_FALSE(findLatest(root).ok());
  fs::remove_all(root);
}

// A huge samples_consumed once indexed past the data (SIGSEGV with --shuffle on).
TEST(Manifest, ImplausiblePositionsAreRefused) {
  for (int64_t consumed : {int64_t(1) << 62, INT64_MAX}) {
    Manifest m = sampleManifest();
    m.samples_consumed = consumed;
    m.epoch = consumed / m.dataset_samples;
    auto r = parseManifest(manifestToJson(m), "mf");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("implausible"), std::string::npos) << r.error().message;
  }
  Manifest wrong_epoch = sampleManifest();
  wrong_epoch.epoch = 5;
  EXPECT_FALSE(parseManifest(manifestToJson(wrong_epoch), "mf").ok());
  Manifest data = sampleManifest();
  data.data = {{"input_ids.npy", 1234, std::string(64, 'c')}};
  auto back = parseManifest(manifestToJson(data), "mf");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->data.size(), 1u);
  EXPECT_EQ(back->data[0].bytes, 1234);
  EXPECT_EQ(manifestToJson(*back), manifestToJson(data));
}

std::string tinyModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto *g = m.mutable_graph();
  g->set_name("tiny");
  auto *w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(2);
  for (float v : {5.f, 6.f}) w->add_float_data(v); // typed field: export must clear it
  auto *ids = g->add_initializer();
  ids->set_name("shape");
  ids->set_data_type(onnx::TensorProto::INT64);
  ids->add_dims(1);
  ids->add_int64_data(2);
  auto *n = g->add_node();
  n->set_op_type("Identity");
  n->add_input("w");
  n->add_output("y");
  g->add_output()->set_name("y");
  return m.SerializeAsString();
}

TEST(OnnxExport, ReplacesInitializersByNameAndNothingElse) {
  const std::string root = scratch("export");
  writeText(root + "/m.onnx", tinyModel());
  auto n = writeOnnxWithWeights(root + "/m.onnx", {{"w", f32({2}, {7, 8})}}, root + "/out.onnx");
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, 1);
  onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(*readFile(root + "/out.onnx")));
  const auto &w = out.graph().initializer(0);
  EXPECT_EQ(w.float_data_size(), 0);
  EXPECT_EQ(w.raw_data(), f32({2}, {7, 8}).data);
  onnx::ModelProto in;
  ASSERT_TRUE(in.ParseFromString(tinyModel()));
  EXPECT_EQ(out.graph().initializer(1).SerializeAsString(), in.graph().initializer(1).SerializeAsString());
  EXPECT_EQ(out.graph().node(0).SerializeAsString(), in.graph().node(0).SerializeAsString());

  auto wrong_shape = writeOnnxWithWeights(root + "/m.onnx", {{"w", f32({3}, {1, 2, 3})}}, root + "/bad.onnx");
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_NE(wrong_shape.error().message.find("initializer 'w' is f32[2], the trained weight is f32[3]"),
            std::string::npos)
      << wrong_shape.error().message;
  auto unknown = writeOnnxWithWeights(root + "/m.onnx", {{"v", f32({2}, {1, 2})}}, root + "/bad.onnx");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("has no initializer named 'v'"), std::string::npos);
  EXPECT_FALSE(fs::exists(root + "/bad.onnx")); // nothing half-written
  fs::remove_all(root);
}

} // namespace
} // namespace rannc::checkpoint
