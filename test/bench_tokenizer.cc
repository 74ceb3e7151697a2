// tokenizer throughput: encode a text file with tokenizer.h, print MB/s (cpu time; cold = the
// first call after load, empty word cache; warm = best of the repeats); optionally write the
// ids (one per line) so test/bench_tokenizer.py can compare them with hf tokenizers.
//   g++ -std=c++17 -O2 -I. test/bench_tokenizer.cc -o build/bench_tokenizer -lpthread
//   ./build/bench_tokenizer TOKENIZER_JSON TEXT_FILE [IDS_OUT] [REPEATS]
#include "tokenizer.h"
#include <stdio.h>
#include <chrono>
#include <time.h>

// cpu time of this process: robust to other load on a shared machine (single-threaded code)
static double cpu_s() { timespec ts; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }

static bool slurp(const char* path, std::string* out) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, k);
    fclose(f);
    return true;
}

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [IDS_OUT] [REPEATS]\n", argv[0]); return 1; }
    std::string tj, text, err;
    if (!slurp(argv[1], &tj) || !slurp(argv[2], &text)) { fprintf(stderr, "cannot read input\n"); return 1; }
    int repeats = argc > 4 ? atoi(argv[4]) : 5;
    static Tokenizer tok;
    auto t0 = std::chrono::steady_clock::now();
    if (!tokenizer_load(&tok, tj.data(), tj.size(), &err)) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int> ids;
    double cold = 0, best = 1e9;
    for (int r = 0; r <= repeats; r++) {
        ids.clear();
        double a = cpu_s();
        tokenizer_encode(&tok, text, &ids);
        double s = cpu_s() - a;
        if (r == 0) cold = s; else best = std::min(best, s);
    }
    // decode speed too (one shot)
    double a = cpu_s();
    std::string back = tokenizer_decode(&tok, ids);
    double dec = cpu_s() - a;
    double mb = text.size() / 1e6;
    printf("ninfer  %-28s %8.3f MB %8zu tokens  load %.2fs  encode cold %6.1f MB/s  warm %6.1f MB/s  decode %6.0f MB/s\n",
           argv[2], mb, ids.size(), load_s, mb / cold, mb / best, mb / dec);
    if (argc > 3 && argv[3][0]) {
        FILE* f = fopen(argv[3], "w");
        for (int id : ids) fprintf(f, "%d\n", id);
        fclose(f);
    }
    return 0;
}
