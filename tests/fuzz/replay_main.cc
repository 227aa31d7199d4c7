// A driver for the fuzz targets where libFuzzer is not linked in (GCC builds,
// `make test`): runs every input of the given corpus directories, then
// `--mutations N` inputs made from them by random edits (bit flips, bytes set
// to boundary values, insertions, deletions, splices), seeded by `--seed`.
// Deterministic for a seed; a crash or abort fails the test, and the input that
// caused it is written to `fuzz-crash-<target>` (by a signal handler, so a run
// costs nothing extra).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

using Input = std::string;

// Boundary bytes: where length fields, varints and enum values change meaning.
constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x02, 0x07, 0x08, 0x0a, 0x10, 0x1f,
                                    0x20, 0x3f, 0x40, 0x7f, 0x80, 0x81, 0xfe, 0xff};

Input Mutate(const std::vector<Input>& corpus, std::mt19937_64& rng) {
  Input input = corpus[rng() % corpus.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = input.empty() ? 0 : rng() % input.size();
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!input.empty()) input[at] = static_cast<char>(input[at] ^ (1u << (rng() % 8)));
        break;
      case 1:  // a boundary value
        if (!input.empty()) {
          input[at] = static_cast<char>(kInteresting[rng() % sizeof(kInteresting)]);
        }
        break;
      case 2:  // insert bytes
        input.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
        break;
      case 3:  // erase a range
        if (!input.empty()) input.erase(at, 1 + rng() % std::min<size_t>(16, input.size() - at));
        break;
      case 4: {  // splice in a piece of another input
        const Input& other = corpus[rng() % corpus.size()];
        if (!other.empty()) {
          const size_t from = rng() % other.size();
          input.insert(at, other, from, 1 + rng() % (other.size() - from));
        }
        break;
      }
      case 5:  // truncate
        input.resize(at);
        break;
    }
  }
  return input;
}

// The input running now, for the crash handler.
const Input* current = nullptr;
char crash_path[256];

void WriteReproducer(int signal_number) {
  if (current != nullptr) {
    const int fd = ::open(crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, current->data(), current->size());
      ::close(fd);
    }
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void Run(const Input& input) {
  current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  current = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const char* target = std::strrchr(argv[0], '/') ? std::strrchr(argv[0], '/') + 1 : argv[0];
  long mutations = 0;
  uint64_t seed = 1;
  std::vector<Input> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::atol(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--help" || arg.rfind("--", 0) == 0) {
      std::printf("usage: %s [--mutations N] [--seed S] CORPUS_DIR_OR_FILE...\n", target);
      return arg == "--help" ? 0 : 2;
    } else {
      const std::filesystem::path path(arg);
      std::vector<std::filesystem::path> files;
      if (std::filesystem::is_directory(path)) {
        for (const auto& entry : std::filesystem::directory_iterator(path)) {
          if (entry.is_regular_file()) files.push_back(entry.path());
        }
        std::sort(files.begin(), files.end());
      } else {
        files.push_back(path);
      }
      for (const auto& file : files) {
        std::ifstream in(file, std::ios::binary);
        corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "%s: no corpus inputs given\n", target);
    return 2;
  }
  std::snprintf(crash_path, sizeof crash_path, "fuzz-crash-%s", target);
  for (int signal_number : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) {
    std::signal(signal_number, WriteReproducer);
  }
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (const Input& input : corpus) Run(input);
  std::mt19937_64 rng(seed);
  for (long i = 0; i < mutations; ++i) Run(Mutate(corpus, rng));
  std::printf("%s: %zu corpus inputs and %ld mutations (seed %llu) ran without a crash\n", target,
              corpus.size(), mutations, static_cast<unsigned long long>(seed));
  return 0;
}
