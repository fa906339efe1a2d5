// A per-layer GPU expert cache for ExLlamaV3's MoE kernels: a device-side directory and lookup kernel that
// rewrites the pointer tables `exl3_mgemm` / `exl3_moe` read (so hits and misses run through the unchanged
// kernels, bit for bit), and a fetch kernel that fills the missed slots from mapped pinned host memory.
//
// The replacement policies (LRU with a pinned hot set, the recipe's; decayed frequency) are policy.cuh's, the
// same source a host build replays against glm53's simulator in the tests. A step looks its selections up in
// order (one thread), then every thread decides for its share of the slots which ones leave.
//
// Nothing here synchronizes with the host: lookup and fetch are plain kernel launches on the caller's streams,
// so both run inside CUDA graphs (the graph captures the tensors' addresses; their contents move on).

#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "policy.cuh"

using namespace glm53_cache;

namespace {

// What this build's lookup takes and does (the policy arguments came with api 2; api 3 returns a freed expert's
// entries to its home copy at the next lookup, not in the step that still computes it). The runner finds this
// text in the built module without importing it (glm53.serve.engines.exllamav3.expert_cache.EXTENSION_API): a
// module built from older sources is refused before TabbyAPI starts, not at the first decode step.
constexpr int API_VERSION = 3;
constexpr const char* API_MARKER = "<glm53_expert_cache api 3>";

constexpr int LOOKUP_THREADS = 256;
constexpr int MAX_SELECTED = 128;    // one step's selections of one layer (rows x top_k)
constexpr int MAX_SLOTS = 8192;

__device__ __forceinline__ uint64_t global_timer_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void lookup_kernel
(
    const int64_t* __restrict__ selected,
    int n,
    Directory d,
    int* __restrict__ miss_expert,
    int* __restrict__ miss_slot,
    int* __restrict__ miss_count,
    Tables tables,
    uint8_t* slot_base,
    int64_t slot_bytes
)
{
    __shared__ unsigned char evict[MAX_SLOTS];
    __shared__ StepResult result;

    // The experts freed by the last step go home now, before this step may admit another expert into their slot.
    if (tables.home_gate)
    {
        for (int e = threadIdx.x; e < d.experts; e += blockDim.x) return_home(d, tables, e);
        __syncthreads();
    }
    if (threadIdx.x == 0)
    {
        result = look_up(selected, n, d, miss_expert, miss_slot);
        for (int i = 0; i < result.misses; ++i)
            point_at_slot(tables, miss_expert[i], (int64_t) (slot_base + miss_slot[i] * slot_bytes));
        *miss_count = result.misses;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < d.slots; s += blockDim.x) evict[s] = evicts(d, s, result);
    __syncthreads();
    for (int s = threadIdx.x; s < d.slots; s += blockDim.x)
    {
        if (evict[s]) release(d, s);  // its table entries still name the slot until the next lookup
    }
    __syncthreads();
    if (threadIdx.x == 0) d.state[STATE_T0] = (int64_t) global_timer_ns();
}

// Copies each missed expert (slot_bytes, 16-byte aligned) from the host pool, read through its mapped device
// address, into its slot. With bytes_per_us > 0 the copy is paced to that rate from the lookup's end: chunk i
// of the step's misses may start only once i's bytes would have crossed a link of that speed.
__global__ void fetch_kernel
(
    const int* __restrict__ miss_expert,
    const int* __restrict__ miss_slot,
    const int* __restrict__ miss_count,
    const int64_t* __restrict__ state,
    const uint8_t* host_pool,
    int64_t expert_bytes,
    uint8_t* slot_base,
    int64_t slot_bytes,
    double bytes_per_ns
)
{
    const int j = blockIdx.y;
    if (j >= *miss_count) return;
    const int e = miss_expert[j];
    const int s = miss_slot[j];
    const uint4* src = (const uint4*) (host_pool + e * expert_bytes);
    uint4* dst = (uint4*) (slot_base + s * slot_bytes);
    const int64_t vectors = expert_bytes / 16;
    const int64_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
    const int64_t begin = blockIdx.x * per_block;
    const int64_t end = vectors < begin + per_block ? vectors : begin + per_block;
    constexpr int64_t CHUNK = 1024;  // vectors (16 KiB) per paced chunk

    const uint64_t t0 = (uint64_t) state[STATE_T0];
    for (int64_t chunk = begin; chunk < end; chunk += CHUNK)
    {
        if (bytes_per_ns > 0.0)
        {
            if (threadIdx.x == 0)
            {
                const double offset = (double) j * expert_bytes + (double) (chunk + CHUNK) * 16.0;
                const uint64_t start = t0 + (uint64_t) (offset / bytes_per_ns);
                while (global_timer_ns() < start) __nanosleep(500);
            }
            __syncthreads();
        }
        const int64_t stop = end < chunk + CHUNK ? end : chunk + CHUNK;
        for (int64_t v = chunk + threadIdx.x; v < stop; v += blockDim.x) dst[v] = src[v];
    }
}

void check_i32(const at::Tensor& t, const char* name)
{
    TORCH_CHECK(t.is_cuda() && t.dtype() == at::kInt && t.is_contiguous(), name, " must be a contiguous int32 CUDA tensor");
}

void check_i64(const at::Tensor& t, const char* name)
{
    TORCH_CHECK(t.is_cuda() && t.dtype() == at::kLong && t.is_contiguous(), name, " must be a contiguous int64 CUDA tensor");
}

}  // namespace

void lookup
(
    const at::Tensor& selected,
    at::Tensor& slot_of_expert,
    at::Tensor& expert_of_slot,
    at::Tensor& stamp,
    at::Tensor& state,
    at::Tensor& miss_expert,
    at::Tensor& miss_slot,
    at::Tensor& miss_count,
    at::Tensor& table_gate,
    at::Tensor& table_up,
    at::Tensor& table_down,
    int64_t offset_gate,
    int64_t offset_up,
    int64_t offset_down,
    const at::Tensor& slot_pool,
    int64_t slot_bytes,
    int64_t pinned,
    int64_t window,
    const c10::optional<at::Tensor>& home_gate,
    const c10::optional<at::Tensor>& home_up,
    const c10::optional<at::Tensor>& home_down,
    int64_t policy,
    int64_t recent,
    double rate,
    const c10::optional<at::Tensor>& score,
    const c10::optional<at::Tensor>& last
)
{
    const at::cuda::OptionalCUDAGuard device_guard(selected.device());
    check_i64(selected, "selected");
    check_i32(slot_of_expert, "slot_of_expert");
    check_i32(expert_of_slot, "expert_of_slot");
    check_i64(stamp, "stamp");
    check_i64(state, "state");
    check_i32(miss_expert, "miss_expert");
    check_i32(miss_slot, "miss_slot");
    check_i32(miss_count, "miss_count");
    check_i64(table_gate, "table_gate");
    check_i64(table_up, "table_up");
    check_i64(table_down, "table_down");
    const int n = (int) selected.numel();
    const int experts = (int) slot_of_expert.numel();
    const int slots = (int) expert_of_slot.numel();
    TORCH_CHECK(n <= MAX_SELECTED, "at most ", MAX_SELECTED, " selections a step, got ", n);
    TORCH_CHECK(slots <= MAX_SLOTS, "at most ", MAX_SLOTS, " slots a layer, got ", slots);
    TORCH_CHECK(stamp.numel() == slots, "stamp must have one entry per slot");
    TORCH_CHECK(state.numel() >= STATE_FIELDS, "state must have ", STATE_FIELDS, " entries");
    TORCH_CHECK(miss_expert.numel() >= n && miss_slot.numel() >= n, "miss lists must hold one step's selections");
    TORCH_CHECK(table_gate.numel() == experts && table_up.numel() == experts && table_down.numel() == experts,
                "pointer tables must have one entry per expert");
    TORCH_CHECK(0 <= pinned && pinned <= slots, "pinned slots must lie in [0, slots]");
    TORCH_CHECK(window >= 0 && slots - pinned >= window + n,
                "unpinned slots (", slots - pinned, ") must hold the window (", window, ") and one step's selections (", n, ")");
    TORCH_CHECK(slot_pool.is_cuda() && slot_pool.numel() * slot_pool.element_size() >= slots * slot_bytes,
                "slot_pool must be a CUDA tensor of slots x slot_bytes bytes");
    TORCH_CHECK(policy == POLICY_LRU || policy == POLICY_FREQUENCY, "policy must be ", POLICY_LRU, " (LRU) or ",
                POLICY_FREQUENCY, " (decayed frequency)");
    double* score_ptr = nullptr;
    int64_t* last_ptr = nullptr;
    if (policy == POLICY_FREQUENCY)
    {
        TORCH_CHECK(pinned == 0, "the frequency policy pins no slots");
        TORCH_CHECK(recent >= 0 && rate >= 1.0, "the frequency policy needs recent >= 0 and a growth rate >= 1");
        TORCH_CHECK(score.has_value() && last.has_value(), "the frequency policy needs its score and last tensors");
        const at::Tensor& sc = score.value();
        TORCH_CHECK(sc.is_cuda() && sc.dtype() == at::kDouble && sc.is_contiguous() && sc.numel() == experts + 1,
                    "score must be a contiguous float64 CUDA tensor of experts + 1 entries (the last: the growth)");
        check_i64(last.value(), "last");
        TORCH_CHECK(last.value().numel() == experts, "last must have one entry per expert");
        score_ptr = sc.data_ptr<double>();
        last_ptr = last.value().data_ptr<int64_t>();
    }
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const bool home = home_gate.has_value();
    TORCH_CHECK(home == home_up.has_value() && home == home_down.has_value(), "give all three home tables or none");
    if (home)
    {
        for (const at::Tensor* t : {&home_gate.value(), &home_up.value(), &home_down.value()})
        {
            check_i64(*t, "home tables");
            TORCH_CHECK(t->numel() == experts, "home tables must have one entry per expert");
        }
    }
    Tables tables {
        table_gate.data_ptr<int64_t>(), table_up.data_ptr<int64_t>(), table_down.data_ptr<int64_t>(),
        home ? home_gate.value().data_ptr<int64_t>() : nullptr,
        home ? home_up.value().data_ptr<int64_t>() : nullptr,
        home ? home_down.value().data_ptr<int64_t>() : nullptr,
        offset_gate, offset_up, offset_down
    };
    Directory directory {
        experts, slots, (int) pinned, (int) window, (int) policy, recent, rate,
        slot_of_expert.data_ptr<int>(), expert_of_slot.data_ptr<int>(), stamp.data_ptr<int64_t>(),
        state.data_ptr<int64_t>(), score_ptr, last_ptr
    };
    lookup_kernel<<<1, LOOKUP_THREADS, 0, stream>>>(
        selected.data_ptr<int64_t>(), n, directory, miss_expert.data_ptr<int>(), miss_slot.data_ptr<int>(),
        miss_count.data_ptr<int>(), tables, (uint8_t*) slot_pool.data_ptr(), slot_bytes
    );
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fetch
(
    const at::Tensor& miss_expert,
    const at::Tensor& miss_slot,
    const at::Tensor& miss_count,
    const at::Tensor& state,
    int64_t host_pool_device_address,
    int64_t expert_bytes,
    at::Tensor& slot_pool,
    int64_t slot_bytes,
    int64_t max_misses,
    int64_t blocks_per_miss,
    double gbytes_per_s
)
{
    const at::cuda::OptionalCUDAGuard device_guard(slot_pool.device());
    TORCH_CHECK(expert_bytes % 16 == 0 && slot_bytes % 16 == 0, "expert and slot sizes must be multiples of 16 bytes");
    TORCH_CHECK(expert_bytes <= slot_bytes, "an expert must fit its slot");
    TORCH_CHECK(host_pool_device_address % 16 == 0, "the host pool must be 16-byte aligned");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    dim3 grid((unsigned) blocks_per_miss, (unsigned) max_misses);
    fetch_kernel<<<grid, 512, 0, stream>>>(
        miss_expert.data_ptr<int>(), miss_slot.data_ptr<int>(), miss_count.data_ptr<int>(), state.data_ptr<int64_t>(),
        (const uint8_t*) host_pool_device_address, expert_bytes, (uint8_t*) slot_pool.data_ptr(), slot_bytes,
        gbytes_per_s  // GB/s == bytes/ns
    );
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Page-locks an existing host buffer of exactly its size (no power-of-two rounding, unlike cudaHostAlloc
// through torch's pinned allocator) and maps it into the device's address space; returns the device address.
int64_t host_register(const at::Tensor& buffer)
{
    TORCH_CHECK(!buffer.is_cuda() && buffer.is_contiguous(), "host_register takes a contiguous CPU tensor");
    void* ptr = buffer.data_ptr();
    const size_t bytes = buffer.numel() * buffer.element_size();
    cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    TORCH_CHECK(err == cudaSuccess, "cudaHostRegister(", bytes, " bytes): ", cudaGetErrorString(err));
    void* device_ptr = nullptr;
    err = cudaHostGetDevicePointer(&device_ptr, ptr, 0);
    TORCH_CHECK(err == cudaSuccess, "cudaHostGetDevicePointer: ", cudaGetErrorString(err));
    return (int64_t) device_ptr;
}

void host_unregister(const at::Tensor& buffer)
{
    cudaError_t err = cudaHostUnregister(buffer.data_ptr());
    TORCH_CHECK(err == cudaSuccess, "cudaHostUnregister: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "glm53's GPU expert cache for ExLlamaV3's MoE kernels";
    m.def("lookup", &lookup, "look one step's selections up, admit misses, rewrite the pointer tables",
          py::arg("selected"), py::arg("slot_of_expert"), py::arg("expert_of_slot"), py::arg("stamp"), py::arg("state"),
          py::arg("miss_expert"), py::arg("miss_slot"), py::arg("miss_count"), py::arg("table_gate"), py::arg("table_up"),
          py::arg("table_down"), py::arg("offset_gate"), py::arg("offset_up"), py::arg("offset_down"), py::arg("slot_pool"),
          py::arg("slot_bytes"), py::arg("pinned"), py::arg("window"), py::arg("home_gate") = py::none(),
          py::arg("home_up") = py::none(), py::arg("home_down") = py::none(), py::arg("policy") = POLICY_LRU,
          py::arg("recent") = 1, py::arg("rate") = 1.0, py::arg("score") = py::none(), py::arg("last") = py::none());
    m.def("fetch", &fetch, "copy the step's missed experts from mapped pinned host memory into their slots");
    m.def("host_register", &host_register, "page-lock and map a CPU tensor; returns its device address");
    m.def("host_unregister", &host_unregister, "undo host_register");
    m.attr("STATE_FIELDS") = py::int_(STATE_FIELDS);
    m.attr("STATE_STEP") = py::int_(STATE_STEP);
    m.attr("STATE_HITS") = py::int_(STATE_HITS);
    m.attr("STATE_MISSES") = py::int_(STATE_MISSES);
    m.attr("STATE_OVERFLOW") = py::int_(STATE_OVERFLOW);
    m.attr("API_VERSION") = py::int_(API_VERSION);
    m.attr("API_MARKER") = py::str(API_MARKER);
    m.attr("POLICY_LRU") = py::int_(POLICY_LRU);
    m.attr("POLICY_FREQUENCY") = py::int_(POLICY_FREQUENCY);
    m.attr("NEVER") = py::int_(NEVER);
}
