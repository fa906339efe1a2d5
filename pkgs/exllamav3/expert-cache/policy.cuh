// The cache's replacement policies, one layer's decode step at a time. The GPU lookup kernel (expert_cache.cu)
// and a host build of this same file (tests/support/cache_policy_replay.cpp, run by tests/test_cache_policy.py
// beside glm53's simulator, glm53.plan.cache.policies) decide every hit, admission and eviction with it.
//
//   POLICY_LRU        slots [0, pinned) hold the layer's hottest experts for good; the other slots keep the
//                     `window` most recently used experts (pinned_lru_step_hits).
//   POLICY_FREQUENCY  the `window` experts of highest priority stay: the experts used in the last `recent`
//                     steps first, then decayed counts (each use adds the growth, which is multiplied by
//                     `rate` = 2^(1/half-life) every step); ties: the less recently used goes, then the lower id
//                     (decayed_frequency). A just-used expert that loses to every resident one is computed from
//                     its staging slot and not kept.
//
// A step: return_home (one call per expert) gives the last step's freed experts their home entries back, look_up
// (one thread) admits the misses into free slots and point_at_slot names them in the tables, then evicts (one call
// per slot, in parallel on the GPU) says which resident slots leave, and release frees them. Between steps every
// policy holds at most `window` unpinned experts, so `window + selections` unpinned slots always suffice.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GLM53_HD __host__ __device__ __forceinline__
#else
#define GLM53_HD inline
#endif

namespace glm53_cache {

// state[] fields, one int64 array per layer
constexpr int STATE_STEP = 0;        // decode steps looked up so far
constexpr int STATE_HITS = 1;        // selections served from a resident slot
constexpr int STATE_MISSES = 2;      // selections copied in
constexpr int STATE_T0 = 3;          // %globaltimer when the last lookup finished (the fetch's pacing origin)
constexpr int STATE_OVERFLOW = 4;    // misses that found no free slot (a sizing error; must stay 0)
constexpr int STATE_FIELDS = 8;

constexpr int POLICY_LRU = 0;
constexpr int POLICY_FREQUENCY = 1;

// The simulator's constants: a recently used expert's priority is lifted above every count, and the counts are
// renormalised once the growth passes 1e150. Same double operations in the same order: the same ranks.
constexpr double LIFT = 1e200;
constexpr double RENORMALISE = 1e150;
constexpr int64_t NEVER = -(int64_t(1) << 40);  // `last` of an expert never selected

struct Directory
{
    int experts;
    int slots;
    int pinned;
    int window;             // LRU: the window; frequency: the experts kept
    int policy;
    int64_t recent;         // frequency: steps whose experts outrank every count
    double rate;            // frequency: the growth's factor per step
    int* slot_of_expert;    // [experts], -1 where not resident
    int* expert_of_slot;    // [slots], -1 where free
    int64_t* stamp;         // [slots], LRU: step * selections + position of the last use
    int64_t* state;         // [STATE_FIELDS]
    double* score;          // frequency: [experts + 1], a decayed count per expert, then the growth
    int64_t* last;          // frequency: [experts], the last step an expert was selected in
};

struct StepResult
{
    int misses;
    int resident;           // occupied unpinned slots once the misses are admitted
    int64_t step;
};

// One step's selections (n, -1 for a masked one) looked up in order. A miss takes the lowest free unpinned slot
// and is listed in miss_expert / miss_slot. A repeat inside the step (several rows) counts once, as the first
// access did.
GLM53_HD StepResult look_up(const int64_t* selected, int n, const Directory& d, int* miss_expert, int* miss_slot)
{
    const int64_t step = d.state[STATE_STEP];
    d.state[STATE_STEP] = step + 1;
    const bool frequency = d.policy == POLICY_FREQUENCY;
    int hits = 0;
    int misses = 0;
    int next_free = d.pinned;
    for (int j = 0; j < n; ++j)
    {
        const int64_t e64 = selected[j];
        if (e64 < 0 || e64 >= d.experts) continue;  // masked selection (-1): the kernels skip it too
        const int e = (int) e64;
        const int64_t time = step * n + j;
        if (frequency)
        {
            d.last[e] = step;
            d.score[e] += d.score[d.experts];
        }
        const int s = d.slot_of_expert[e];
        if (s >= 0)
        {
            bool repeat = false;
            for (int i = 0; i < misses; ++i) repeat |= miss_expert[i] == e;
            if (!repeat && s >= d.pinned && d.stamp[s] / n == step) repeat = true;
            if (!repeat) ++hits;
            if (s >= d.pinned) d.stamp[s] = time;
            continue;
        }
        while (next_free < d.slots && d.expert_of_slot[next_free] >= 0) ++next_free;
        if (next_free >= d.slots)
        {
            ++d.state[STATE_OVERFLOW];
            continue;
        }
        const int slot = next_free++;
        d.expert_of_slot[slot] = e;
        d.slot_of_expert[e] = slot;
        d.stamp[slot] = time;
        miss_expert[misses] = e;
        miss_slot[misses] = slot;
        ++misses;
    }
    if (frequency)
    {
        double growth = d.score[d.experts] * d.rate;
        if (growth > RENORMALISE)
        {
            for (int e = 0; e < d.experts; ++e) d.score[e] /= growth;
            growth = 1.0;
        }
        d.score[d.experts] = growth;
    }
    d.state[STATE_HITS] += hits;
    d.state[STATE_MISSES] += misses;
    int resident = 0;
    for (int s = d.pinned; s < d.slots; ++s) resident += d.expert_of_slot[s] >= 0;
    return StepResult { misses, resident, step };
}

GLM53_HD double priority(const Directory& d, int e, int64_t step)
{
    return d.score[e] + (d.last[e] > step - d.recent ? LIFT : 0.0);
}

// Whether expert a leaves before expert b (the lower priority, then the less recently used, then the lower id).
GLM53_HD bool leaves_before(const Directory& d, int a, int b, int64_t step)
{
    const double pa = priority(d, a, step);
    const double pb = priority(d, b, step);
    if (pa != pb) return pa < pb;
    if (d.last[a] != d.last[b]) return d.last[a] < d.last[b];
    return a < b;
}

// Whether the expert in unpinned slot s leaves after this step. LRU: `window` or more residents are newer (stamps
// are unique, so the count is exact). Frequency: fewer than (resident - window) residents leave before it.
GLM53_HD bool evicts(const Directory& d, int s, const StepResult& r)
{
    const int e = d.expert_of_slot[s];
    if (s < d.pinned || e < 0) return false;
    int ahead = 0;
    if (d.policy == POLICY_FREQUENCY)
    {
        const int leaving = r.resident - d.window;
        if (leaving <= 0) return false;
        for (int o = d.pinned; o < d.slots; ++o)
        {
            const int other = d.expert_of_slot[o];
            ahead += (o != s && other >= 0 && leaves_before(d, other, e, r.step));
        }
        return ahead < leaving;
    }
    const int64_t t = d.stamp[s];
    for (int o = d.pinned; o < d.slots; ++o) ahead += (d.expert_of_slot[o] >= 0 && d.stamp[o] > t);
    return ahead >= d.window;
}

// A layer's pointer tables (one gate, up and down entry per expert, read by the engine's kernels) and where a
// freed expert's entries go back to (null: left as they are). An expert freed in the step that selected it (a
// window smaller than a step's selections, or the frequency policy's computed-from-staging) is still computed
// from its slot, whose bytes stay until a later lookup admits another expert there; so its entries go home at the
// start of the next lookup (return_home), not when it is freed. Paths that bypass the lookup (prefill's
// exl3_moe, run_single_expert) read the home copy: resident experts, or the staging arena of host-resident ones.
struct Tables
{
    int64_t* gate;
    int64_t* up;
    int64_t* down;
    const int64_t* home_gate;
    const int64_t* home_up;
    const int64_t* home_down;
    int64_t offset_gate;
    int64_t offset_up;
    int64_t offset_down;
};

// A just-admitted expert's entries name its slot (the slot's address in the pool).
GLM53_HD void point_at_slot(const Tables& t, int e, int64_t slot_address)
{
    t.gate[e] = slot_address + t.offset_gate;
    t.up[e] = slot_address + t.offset_up;
    t.down[e] = slot_address + t.offset_down;
}

// Before a lookup admits anything: an expert no longer resident gets its home entries back.
GLM53_HD void return_home(const Directory& d, const Tables& t, int e)
{
    if (!t.home_gate || d.slot_of_expert[e] >= 0 || t.gate[e] == t.home_gate[e]) return;
    t.gate[e] = t.home_gate[e];
    t.up[e] = t.home_up[e];
    t.down[e] = t.home_down[e];
}

// Frees slot s; returns the expert that left.
GLM53_HD int release(const Directory& d, int s)
{
    const int e = d.expert_of_slot[s];
    d.slot_of_expert[e] = -1;
    d.expert_of_slot[s] = -1;
    return e;
}

}  // namespace glm53_cache
