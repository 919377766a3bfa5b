// Measures this machine's memory copy bandwidth (bytes read + bytes written per second) with a
// large memcpy split over threads: the ceiling that CPU decode speed is compared against.
// Usage: bench_copy_bandwidth [MiB per buffer, default 1024] [threads, default all]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  unsigned threads = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : std::thread::hardware_concurrency();
  size_t bytes = mib << 20;
  std::vector<char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; i += 4096) src[i] = static_cast<char>(i);  // fault pages in
  std::memset(dst.data(), 1, bytes);
  fmt::print("bench_copy_bandwidth: {} MiB per buffer, {} threads\n", mib, threads);

  auto copy_once = [&] {
    std::vector<std::thread> pool;
    size_t chunk = (bytes + threads - 1) / threads;
    for (unsigned t = 0; t < threads; ++t) {
      size_t b = t * chunk, e = std::min(bytes, b + chunk);
      pool.emplace_back([&, b, e] { std::memcpy(dst.data() + b, src.data() + b, e - b); });
    }
    for (auto& th : pool) th.join();
  };
  copy_once();
  std::vector<double> secs;
  for (int rep = 0; rep < 9; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    copy_once();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  double med = secs[secs.size() / 2];
  fmt::print("median {:.2f} ms per copy; {:.2f} GB/s read+write ({:.2f} GB/s read)\n", med * 1e3,
             2.0 * bytes / med / 1e9, bytes / med / 1e9);
  return 0;
}
