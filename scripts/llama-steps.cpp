// Timed single steps of llama.cpp as llama-server runs them (scripts/llama-steps.sh):
// 1 thread, unified KV of 8192 cells, n_batch 2048, n_ubatch 512, flash attention
// auto; thread CPU time and wall time of one llama_decode per step.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <string>
#include <algorithm>

static double now(clockid_t c) { timespec t; clock_gettime(c, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

struct Seq { int id; int pos; };

static llama_context * ctx;
static llama_batch batch;
static unsigned rng = 12345;
static int tok() { rng = rng * 1103515245u + 12345u; return 300 + (rng >> 8) % 31000; }

// one step: for each decoding seq one token (output), plus for each prompt
// (seq, n) n tokens (output only the last). Returns (cpu ms, wall ms).
static std::pair<double,double> step(std::vector<Seq*> dec, std::vector<std::pair<Seq*,int>> prompts) {
    batch.n_tokens = 0;
    auto add = [&](Seq *s, bool out) {
        int i = batch.n_tokens++;
        batch.token[i] = tok(); batch.pos[i] = s->pos++; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = s->id; batch.logits[i] = out;
    };
    for (auto *s : dec) add(s, true);
    for (auto &p : prompts) for (int k = 0; k < p.second; k++) add(p.first, k == p.second - 1);
    double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    int r = llama_decode(ctx, batch);
    llama_synchronize(ctx);
    double c1 = now(CLOCK_THREAD_CPUTIME_ID), w1 = now(CLOCK_MONOTONIC);
    if (r != 0) { fprintf(stderr, "decode failed %d\n", r); exit(1); }
    return {c1 - c0, w1 - w0};
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); size_t n = v.size(); return n % 2 ? v[n/2] : 0.5 * (v[n/2-1] + v[n/2]); }

int main(int argc, char **argv) {
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 8192; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_seq_max = 8; cp.n_threads = 1; cp.n_threads_batch = 1;
    cp.kv_unified = true; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO; cp.no_perf = true;
    ctx = llama_init_from_model(model, cp);
    batch = llama_batch_init(4096, 0, 1);
    const char *mode = argc > 2 ? argv[2] : "all";
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    auto mem = llama_get_memory(ctx);
    Seq seqs[8]; 
    auto reset = [&]() { llama_memory_clear(mem, true); for (int i = 0; i < 8; i++) seqs[i] = {i, 0}; };
    // warm up
    reset(); step({}, {{&seqs[0], 64}}); for (int k = 0; k < 8; k++) step({&seqs[0]}, {});
    if (!strcmp(mode, "all") || !strcmp(mode, "decode")) {
        // decode-only steps: D sequences, each with a prompt of L tokens, then 32 decode steps; median per step
        for (int L : {16, 384}) for (int D = 1; D <= 8; D++) {
            std::vector<double> cpu, wall;
            for (int r = 0; r < reps; r++) {
                reset();
                for (int i = 0; i < D; i++) step({}, {{&seqs[i], L}});
                std::vector<Seq*> dec; for (int i = 0; i < D; i++) dec.push_back(&seqs[i]);
                for (int k = 0; k < 32; k++) { auto t = step(dec, {}); cpu.push_back(t.first); wall.push_back(t.second); }
            }
            printf("decode L=%d D=%d cpu_ms=%.3f wall_ms=%.3f\n", L, D, median(cpu), median(wall));
        }
    }
    if (!strcmp(mode, "all") || !strcmp(mode, "prompt")) {
        for (int P : {1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256, 384, 512}) {
            std::vector<double> cpu, wall;
            for (int r = 0; r < reps; r++) { reset(); auto t = step({}, {{&seqs[0], P}}); cpu.push_back(t.first); wall.push_back(t.second); }
            printf("prompt P=%d cpu_ms=%.3f wall_ms=%.3f\n", P, median(cpu), median(wall));
        }
    }
    if (!strcmp(mode, "all") || !strcmp(mode, "mixed")) {
        // D sequences decoding (prompt 32, 16 decode steps done) + one new prompt of P tokens
        for (int P : {64, 128, 192}) for (int D = 0; D <= 7; D++) {
            std::vector<double> cpu, wall, dcpu;
            for (int r = 0; r < reps; r++) {
                reset();
                std::vector<Seq*> dec;
                if (D > 0) { std::vector<std::pair<Seq*,int>> pr; for (int i = 0; i < D; i++) { pr.push_back({&seqs[i], 32}); dec.push_back(&seqs[i]); } step({}, pr);
                    for (int k = 0; k < 16; k++) step(dec, {}); 
                    dcpu.push_back(step(dec, {}).first); }
                auto t = step(dec, {{&seqs[7], P}}); cpu.push_back(t.first); wall.push_back(t.second);
            }
            printf("mixed P=%d D=%d cpu_ms=%.3f wall_ms=%.3f decode_alone_cpu_ms=%.3f\n", P, D, median(cpu), median(wall), dcpu.empty() ? 0.0 : median(dcpu));
        }
    }
    if (!strcmp(mode, "all") || !strcmp(mode, "sampler")) {
        auto sp = llama_sampler_chain_default_params();
        llama_sampler *smpl = llama_sampler_chain_init(sp);
        llama_sampler_chain_add(smpl, llama_sampler_init_top_k(40));
        llama_sampler_chain_add(smpl, llama_sampler_init_top_p(0.95f, 1));
        llama_sampler_chain_add(smpl, llama_sampler_init_min_p(0.05f, 1));
        llama_sampler_chain_add(smpl, llama_sampler_init_temp(0.8f));
        llama_sampler_chain_add(smpl, llama_sampler_init_dist(1));
        reset(); step({}, {{&seqs[0], 16}});
        std::vector<double> cpu;
        for (int k = 0; k < 200; k++) { double c0 = now(CLOCK_THREAD_CPUTIME_ID); llama_sampler_sample(smpl, ctx, -1); cpu.push_back(now(CLOCK_THREAD_CPUTIME_ID) - c0); }
        printf("sampler (top-k 40, top-p, min-p, temp, dist over the vocabulary) cpu_ms=%.4f\n", median(cpu));
    }
    return 0;
}
