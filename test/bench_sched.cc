// an emulation of the lanes' decode-step rendezvous as it was before the scheduler's own
// thread (sched_runner, 2026-12-02) took the steps: the lane threads ran them (ninfer.cu
// section 9, LaneSched / sched_decode), to measure what the host adds to a step: N lane threads on one mutex and
// condition variable; a step (a sleep of STEP_US, the device's time) runs when every lane of the
// last step has asked again (or LANE_WAIT_US has passed); each lane spins WORK_US between
// tokens (its sampler, detokenizer and stream). mode 1: every arrival wakes all the waiting
// lanes (sched_decode before 2026-12-01), 0: arrivals wake no one (the arriving lane looks
// itself), 2: as 0, and every lane's next token is queued at the end of its step (greedy lanes:
// the next step starts when the first lane is back, the others' host work overlaps it). a
// measurement tool, not a test: figures in test/bench-notes.md.
//   g++ -std=c++17 -O2 -pthread -o build/test/bench_sched test/bench_sched.cc
//   build/test/bench_sched LANES STEPS STEP_US WORK_US MODE      e.g. 64 200 11000 50 1
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
enum { LANE_WAIT_US = 5000 };

struct Rendezvous {
    int lanes = 0, step_us = 0, work_us = 0, mode = 1;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> want, expected, queued;  // [lanes] as LaneSched's
    std::vector<uint64_t> steps, queued_at;    // [lanes]
    bool running = false;
    double last_end = 0;
    std::atomic<long> wakes{0};
};
static bool ready(const Rendezvous& r) {
    bool any = false, late = false;
    for (int k = 0; k < r.lanes; k++) {
        if (r.want[k]) any = true;
        else if (r.expected[k]) late = true;
    }
    return any && (!late || (now_s() - r.last_end) * 1e6 >= LANE_WAIT_US);
}
static void spin_us(int us) { const double t = now_s() + us * 1e-6; while (now_s() < t) {} }
static void lane(Rendezvous* r, int k, int n_steps) {
    for (int s = 0; s < n_steps; s++) {
        spin_us(r->work_us);
        std::unique_lock<std::mutex> lk(r->mu);
        uint64_t mine = r->steps[k];
        if (r->queued[k]) { mine = r->queued_at[k]; r->queued[k] = 0; }
        else { r->want[k] = 1; r->expected[k] = 0; }
        if (r->mode == 1) r->cv.notify_all();
        for (;;) {
            if (r->steps[k] != mine) break;
            if (!r->running && ready(*r)) {
                std::vector<int> batch;
                for (int j = 0; j < r->lanes; j++) if (r->want[j]) batch.push_back(j);
                r->running = true;
                lk.unlock();
                std::this_thread::sleep_for(std::chrono::microseconds(r->step_us));
                lk.lock();
                for (int j : batch) {
                    r->want[j] = 0; r->steps[j]++; r->expected[j] = 1;
                    if (r->mode == 2 && r->steps[j] < (uint64_t)n_steps) { r->want[j] = 1; r->expected[j] = 0; r->queued[j] = 1; r->queued_at[j] = r->steps[j]; }
                }
                r->running = false; r->last_end = now_s();
                r->cv.notify_all();
                continue;
            }
            r->cv.wait_for(lk, std::chrono::microseconds(LANE_WAIT_US));
            r->wakes++;
        }
    }
    std::lock_guard<std::mutex> lk(r->mu);
    r->expected[k] = 0; r->queued[k] = 0;
    r->cv.notify_all();
}

int main(int argc, char** argv) {
    if (argc != 6) { fprintf(stderr, "usage: bench_sched LANES STEPS STEP_US WORK_US MODE(0|1|2)\n"); return 1; }
    Rendezvous r;
    r.lanes = atoi(argv[1]); const int n_steps = atoi(argv[2]);
    r.step_us = atoi(argv[3]); r.work_us = atoi(argv[4]); r.mode = atoi(argv[5]);
    if (r.lanes < 1 || n_steps < 1 || r.step_us < 0 || r.work_us < 0) { fprintf(stderr, "bench_sched: bad arguments\n"); return 1; }
    r.want.assign(r.lanes, 0); r.expected.assign(r.lanes, 0); r.queued.assign(r.lanes, 0);
    r.steps.assign(r.lanes, 0); r.queued_at.assign(r.lanes, 0);
    const double t0 = now_s();
    std::vector<std::thread> th;
    for (int k = 0; k < r.lanes; k++) th.emplace_back(lane, &r, k, n_steps);
    for (auto& t : th) t.join();
    const double ms = (now_s() - t0) / n_steps * 1e3;
    printf("lanes %d, mode %d, work %d us: %.3f ms a step (device %.3f): the host adds %.3f ms, %.0f wakeups a step (%u cpus)\n",
           r.lanes, r.mode, r.work_us, ms, r.step_us / 1e3, ms - r.step_us / 1e3, (double)r.wakes / n_steps,
           std::thread::hardware_concurrency());
    return 0;
}
