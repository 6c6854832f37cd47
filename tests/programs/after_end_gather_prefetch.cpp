// A native prefetcher's worker thread, started when the library loads and never joined: at
// interpreter exit its static owner is destroyed with the thread still joinable.
#include <chrono>
#include <thread>
struct Prefetcher {
  std::thread worker{[] { std::this_thread::sleep_for(std::chrono::hours(1)); }};
};
static Prefetcher prefetcher;
extern "C" int prefetch_ready() { return 1; }
