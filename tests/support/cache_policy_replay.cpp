// The GPU expert cache's policy code (pkgs/exllamav3/expert-cache/policy.cuh), built for the host: replays a
// routing trace layer by layer, one step at a time, exactly as the lookup kernel steps it (look_up, then
// evicts for every slot, then release), and prints each layer's hits per step.
//
//   cache_policy_replay ROUTES STEPS LAYERS TOP_K EXPERTS POLICY PINNED WINDOW RECENT RATE [RANKINGS]
//
// ROUTES: int64 (steps, layers, top_k), -1 for a masked selection; RANKINGS: int64 (layers, experts), hottest
// first (the pinned experts). Output: one line per layer, "overflow hits_step0 hits_step1 ...".
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "policy.cuh"

using namespace glm53_cache;

static std::vector<int64_t> read_int64(const char* path, size_t count)
{
    std::vector<int64_t> values(count);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(values.data(), sizeof(int64_t), count, f) != count)
    {
        std::fprintf(stderr, "cannot read %zu int64 values from %s\n", count, path);
        std::exit(2);
    }
    std::fclose(f);
    return values;
}

int main(int argc, char** argv)
{
    if (argc != 11 && argc != 12)
    {
        std::fprintf(stderr, "usage: %s ROUTES STEPS LAYERS TOP_K EXPERTS POLICY PINNED WINDOW RECENT RATE [RANKINGS]\n",
                     argv[0]);
        return 2;
    }
    const int steps = std::atoi(argv[2]), layers = std::atoi(argv[3]), top_k = std::atoi(argv[4]);
    const int experts = std::atoi(argv[5]), policy = std::atoi(argv[6]), pinned = std::atoi(argv[7]);
    const int window = std::atoi(argv[8]);
    const int64_t recent = std::atoll(argv[9]);
    const double rate = std::strtod(argv[10], nullptr);
    const std::vector<int64_t> routes = read_int64(argv[1], (size_t) steps * layers * top_k);
    std::vector<int64_t> rankings;
    if (argc == 12) rankings = read_int64(argv[11], (size_t) layers * experts);
    const int slots = pinned + window + top_k;  // as the engine sizes a layer (LayerExpertCache)

    for (int layer = 0; layer < layers; ++layer)
    {
        std::vector<int> slot_of_expert(experts, -1), expert_of_slot(slots, -1);
        std::vector<int64_t> stamp(slots, -1), state(STATE_FIELDS, 0), last(experts, NEVER);
        std::vector<double> score(experts + 1, 0.0);
        score[experts] = 1.0;
        for (int s = 0; s < pinned; ++s)
        {
            const int e = (int) rankings[(size_t) layer * experts + s];
            slot_of_expert[e] = s;
            expert_of_slot[s] = e;
        }
        Directory d { experts, slots, pinned, window, policy, recent, rate, slot_of_expert.data(),
                      expert_of_slot.data(), stamp.data(), state.data(), score.data(), last.data() };
        std::vector<int> miss_expert(top_k), miss_slot(top_k);
        std::vector<unsigned char> evict(slots);
        std::vector<int64_t> selected(top_k);
        std::vector<int64_t> hits(steps);
        for (int step = 0; step < steps; ++step)
        {
            for (int j = 0; j < top_k; ++j) selected[j] = routes[((size_t) step * layers + layer) * top_k + j];
            const int64_t before = state[STATE_HITS];
            const StepResult r = look_up(selected.data(), top_k, d, miss_expert.data(), miss_slot.data());
            for (int s = 0; s < slots; ++s) evict[s] = evicts(d, s, r);
            for (int s = 0; s < slots; ++s)
                if (evict[s]) release(d, s);
            hits[step] = state[STATE_HITS] - before;
        }
        std::printf("%lld", (long long) state[STATE_OVERFLOW]);
        for (int step = 0; step < steps; ++step) std::printf(" %lld", (long long) hits[step]);
        std::printf("\n");
    }
    return 0;
}
