// The GPU expert cache's policy code (pkgs/exllamav3/expert-cache/policy.cuh), built for the host: replays a
// routing trace layer by layer, one step at a time, exactly as the lookup kernel steps it (look_up, then
// evicts for every slot, then release), and prints each layer's hits per step.
//
//   cache_policy_replay ROUTES STEPS LAYERS TOP_K EXPERTS POLICY PINNED WINDOW RECENT RATE [RANKINGS]
//
// ROUTES: int64 (steps, layers, top_k), -1 for a masked selection; RANKINGS: int64 (layers, experts), hottest
// first (the pinned experts). Output: one line per layer, "overflow hits_step0 hits_step1 ...".
//
// It also keeps the layer's pointer tables as the kernel does (return_home, point_at_slot; stand-in addresses for
// the slots and the home copies) and what each slot holds (the fetch writes a miss's bytes into its slot), and
// checks them where the engine reads them: after a step's lookup every selected expert's entries name a slot
// holding that expert (its decode kernels), and between steps every expert's entries name its home copy or
// such a slot (prefill, which reads every entry). The count of entries that do not goes to stderr,
// "table_errors N". REPLAY_HOME_IN_STEP=1 returns a freed expert's entries home when it is freed, in the step
// that still computes it (the kernel before api 3), to show the check catches that order.
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    const char* in_step = std::getenv("REPLAY_HOME_IN_STEP");
    const bool home_in_step = in_step && std::strcmp(in_step, "1") == 0;
    // stand-in addresses: slots from 2^40, home copies from 2^41, 2^20 bytes an expert (gate, up, down inside it)
    const int64_t slot_base = (int64_t) 1 << 40, home_base = (int64_t) 1 << 41, bytes = (int64_t) 1 << 20;
    const int64_t offsets[3] = { 0, bytes / 4, bytes / 2 };
    int64_t table_errors = 0;

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
        std::vector<int64_t> gate(experts), up(experts), down(experts), home_gate(experts), home_up(experts),
            home_down(experts);
        std::vector<int> holds(slots, -1);  // the expert whose bytes are in each slot
        for (int e = 0; e < experts; ++e)
        {
            gate[e] = home_gate[e] = home_base + e * bytes + offsets[0];
            up[e] = home_up[e] = home_base + e * bytes + offsets[1];
            down[e] = home_down[e] = home_base + e * bytes + offsets[2];
        }
        Tables t { gate.data(), up.data(), down.data(), home_gate.data(), home_up.data(), home_down.data(),
                   offsets[0], offsets[1], offsets[2] };
        for (int s = 0; s < pinned; ++s)
        {
            point_at_slot(t, expert_of_slot[s], slot_base + s * bytes);
            holds[s] = expert_of_slot[s];
        }
        // An expert's entries name its home copy, or a slot that holds its bytes (three consistent entries).
        auto names_its_bytes = [&](int e, bool home_allowed) {
            if (home_allowed && gate[e] == home_gate[e] && up[e] == home_up[e] && down[e] == home_down[e]) return true;
            const int64_t at = gate[e] - slot_base - offsets[0];
            if (at < 0 || at % bytes != 0 || at / bytes >= slots) return false;
            const int s = (int) (at / bytes);
            return holds[s] == e && up[e] == slot_base + s * bytes + offsets[1] &&
                   down[e] == slot_base + s * bytes + offsets[2];
        };
        std::vector<int> miss_expert(top_k), miss_slot(top_k);
        std::vector<unsigned char> evict(slots);
        std::vector<int64_t> selected(top_k);
        std::vector<int64_t> hits(steps);
        for (int step = 0; step < steps; ++step)
        {
            for (int j = 0; j < top_k; ++j) selected[j] = routes[((size_t) step * layers + layer) * top_k + j];
            const int64_t before = state[STATE_HITS];
            if (!home_in_step)
                for (int e = 0; e < experts; ++e) return_home(d, t, e);
            const StepResult r = look_up(selected.data(), top_k, d, miss_expert.data(), miss_slot.data());
            for (int i = 0; i < r.misses; ++i)
            {
                point_at_slot(t, miss_expert[i], slot_base + miss_slot[i] * bytes);
                holds[miss_slot[i]] = miss_expert[i];  // the fetch
            }
            for (int s = 0; s < slots; ++s) evict[s] = evicts(d, s, r);
            for (int s = 0; s < slots; ++s)
            {
                if (!evict[s]) continue;
                const int e = release(d, s);
                if (home_in_step) return_home(d, t, e);
            }
            hits[step] = state[STATE_HITS] - before;
            // the step's experts run now (decode reads the selected entries), then prefill may read any entry
            for (int j = 0; j < top_k; ++j)
                if (selected[j] >= 0 && !names_its_bytes((int) selected[j], false)) ++table_errors;
            for (int e = 0; e < experts; ++e)
                if (!names_its_bytes(e, true)) ++table_errors;
        }
        std::printf("%lld", (long long) state[STATE_OVERFLOW]);
        for (int step = 0; step < steps; ++step) std::printf(" %lld", (long long) hits[step]);
        std::printf("\n");
    }
    std::fprintf(stderr, "table_errors %lld\n", (long long) table_errors);
    return 0;
}
