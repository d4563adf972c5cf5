/*
 * attention_cudnn.cu: attention.h through cudnn-frontend's SDPA graphs (the
 * math and the memory layout are stated in attention.h). C++ only because the
 * frontend is; everything it exports is the plain C interface of attention.h.
 *
 * Q, K, V are strided views into the fused qkv activation: for NH = H + 2*KV,
 * q dims [B, H, T, D] strides [T*NH*D, D, NH*D, 1] at offset 0, k and v dims
 * [B, KV, T, D] with the same strides at offsets H*D and (H+KV)*D; dq, dk, dv
 * are the same views into dqkv. cuDNN maps query head h to key/value head
 * h / (H/KV) itself (native GQA), so K and V are read at KV-head width.
 *
 * One graph per (shape, direction, determinism), built on first use and kept
 * until attention_teardown; one workspace shared by all of them, grown when a
 * new graph needs more. Growing frees the old buffer, which cudaFree does only
 * after the device has finished with it.
 */
#include <cudnn.h>

/* The frontend trips two of nvcc's front-end warnings in its own code. */
#pragma nv_diagnostic push
#pragma nv_diag_suppress 128, 2810
#include <cudnn_frontend.h>
#pragma nv_diagnostic pop
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "attention.h"
#include "cuda_common.h"
#include "profile.h"

namespace fe = cudnn_frontend;

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

static void cudnn_check_at(cudnnStatus_t status, const char *what, const char *file, int line)
{
    if (status != CUDNN_STATUS_SUCCESS) {
        char last[512];
        cudnnGetLastErrorString(last, sizeof(last));
        fail_at(file, line, "cuDNN error in %s: %s\n  %s\n  hint: %s", what, cudnnGetErrorString(status), last,
                status == CUDNN_STATUS_NOT_INITIALIZED ? "call attention_setup() first; is libcudnn.so.9 loadable?"
                                                       : "rerun with CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr");
    }
}
#define CUDNN_CHECK(call) cudnn_check_at((call), #call, __FILE__, __LINE__)

typedef std::tuple<int, int, int, int, int, int, int> GraphKey; /* B, T, H, KV, D, backward, deterministic */

struct AttentionState {
    cudnnHandle_t handle = nullptr;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    int deterministic = 1;
    std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> graphs;
};
static AttentionState *att = nullptr;

static std::string key_string(const GraphKey &k)
{
    char s[160];
    snprintf(s, sizeof(s), "%s attention B=%d T=%d H=%d KV=%d D=%d%s", std::get<5>(k) ? "backward" : "forward",
             std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), std::get<4>(k),
             std::get<5>(k) ? (std::get<6>(k) ? " (deterministic)" : " (atomic dQ)") : "");
    return s;
}

static void fe_fail(fe::error_t err, const char *operation, const GraphKey &key, const char *file, int line)
{
    fail_at(file, line,
            "cuDNN frontend error in %s for %s: %s (code %d)\n"
            "  hint: cuDNN SDPA needs an sm_80+ GPU, bf16, head_dim a multiple of 8 up to 256 and 16-byte aligned "
            "pointers; rerun with CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr for its reasoning",
            operation, key_string(key).c_str(), err.get_message().c_str(), (int)err.get_code());
}

/* Builds a graph's plan; on failure returns the error and which step failed. */
static fe::error_t build(fe::graph::Graph &graph, const char **step)
{
    fe::error_t err;
    if ((err = graph.validate()).is_bad()) {
        *step = "graph validate";
        return err;
    }
    if ((err = graph.build_operation_graph(att->handle)).is_bad()) {
        *step = "build_operation_graph";
        return err;
    }
    if ((err = graph.create_execution_plans({fe::HeurMode_t::A})).is_bad()) {
        *step = "create_execution_plans";
        return err;
    }
    if ((err = graph.check_support()).is_bad()) {
        *step = "check_support";
        return err;
    }
    if ((err = graph.build_plans()).is_bad()) {
        *step = "build_plans";
        return err;
    }
    return err;
}

static std::shared_ptr<fe::graph::Graph> new_graph(void)
{
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return graph;
}

/* A strided [b, heads, T, D] view of the fused qkv (or dqkv) layout. */
static fe::graph::Tensor_attributes qkv_view(const char *name, int64_t uid, int64_t B, int64_t heads, int64_t T,
                                             int64_t D, int64_t NH)
{
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({B, heads, T, D})
        .set_stride({T * NH * D, D, NH * D, 1});
}

/* out / dout: [B, T, H, D] row-major seen as [B, H, T, D]. */
static std::vector<int64_t> out_stride(int64_t T, int64_t H, int64_t D)
{
    return {T * H * D, D, H * D, 1};
}
static fe::graph::Tensor_attributes out_view(const char *name, int64_t uid, int64_t B, int64_t T, int64_t H, int64_t D)
{
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({B, H, T, D})
        .set_stride(out_stride(T, H, D));
}
static std::vector<int64_t> stats_stride(int64_t T, int64_t H)
{
    return {H * T, T, 1, 1};
}

static fe::error_t forward_graph(const GraphKey &key, std::shared_ptr<fe::graph::Graph> *built, const char **step)
{
    int64_t B = std::get<0>(key), T = std::get<1>(key), H = std::get<2>(key), KV = std::get<3>(key),
            D = std::get<4>(key), NH = H + 2 * KV;
    auto graph = new_graph();
    auto Q = graph->tensor(qkv_view("Q", UID_Q, B, H, T, D, NH));
    auto K = graph->tensor(qkv_view("K", UID_K, B, KV, T, D, NH));
    auto V = graph->tensor(qkv_view("V", UID_V, B, KV, T, D, NH));
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sdpa_forward")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(1.0f / sqrtf((float)D));
    auto [O, Stats] = graph->sdpa(Q, K, V, options);
    O->set_output(true).set_uid(UID_O).set_dim({B, H, T, D}).set_stride(out_stride(T, H, D));
    Stats->set_output(true)
        .set_uid(UID_STATS)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, H, T, 1})
        .set_stride(stats_stride(T, H));
    *built = graph;
    return build(*graph, step);
}

static fe::error_t backward_graph(const GraphKey &key, std::shared_ptr<fe::graph::Graph> *built, const char **step)
{
    int64_t B = std::get<0>(key), T = std::get<1>(key), H = std::get<2>(key), KV = std::get<3>(key),
            D = std::get<4>(key), NH = H + 2 * KV;
    bool deterministic = std::get<6>(key) != 0;
    auto graph = new_graph();
    auto Q = graph->tensor(qkv_view("Q", UID_Q, B, H, T, D, NH));
    auto K = graph->tensor(qkv_view("K", UID_K, B, KV, T, D, NH));
    auto V = graph->tensor(qkv_view("V", UID_V, B, KV, T, D, NH));
    auto O = graph->tensor(out_view("O", UID_O, B, T, H, D));
    auto dO = graph->tensor(out_view("dO", UID_DO, B, T, H, D));
    auto Stats = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(UID_STATS)
                                   .set_dim({B, H, T, 1})
                                   .set_stride(stats_stride(T, H))
                                   .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(1.0f / sqrtf((float)D))
                       .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, options);
    dQ->set_output(true).set_uid(UID_DQ).set_dim({B, H, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    dK->set_output(true).set_uid(UID_DK).set_dim({B, KV, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    dV->set_output(true).set_uid(UID_DV).set_dim({B, KV, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    *built = graph;
    return build(*graph, step);
}

static void grow_workspace(const fe::graph::Graph &graph, const GraphKey &key)
{
    int64_t bytes = 0;
    fe::error_t err = graph.get_workspace_size(bytes);
    if (err.is_bad())
        fe_fail(err, "get_workspace_size", key, __FILE__, __LINE__);
    if ((size_t)bytes <= att->workspace_bytes)
        return;
    cuda_free(att->workspace);
    att->workspace = nullptr;
    att->workspace_bytes = 0;
    std::string what = "cuDNN attention workspace for " + key_string(key);
    att->workspace = cuda_malloc_named((size_t)bytes, what.c_str());
    att->workspace_bytes = (size_t)bytes;
}

static const fe::graph::Graph &get_graph(int B, int T, int H, int KV, int D, int backward)
{
    if (att == nullptr)
        FAIL("attention called before attention_setup()");
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || H % KV != 0) {
        FAIL("attention: bad shape B=%d T=%d H=%d KV=%d (H must be a positive multiple of KV)", B, T, H, KV);
    }
    if (D % 8 != 0 || D <= 0 || D > 256) {
        FAIL("attention: head_dim %d is not supported by cuDNN SDPA (needs a multiple of 8, at most 256)", D);
    }
    int deterministic = backward ? att->deterministic : 0;
    GraphKey key(B, T, H, KV, D, backward, deterministic);
    auto found = att->graphs.find(key);
    if (found != att->graphs.end())
        return *found->second;

    const char *step = "";
    GraphKey built = key;
    std::shared_ptr<fe::graph::Graph> graph;
    fe::error_t err = backward ? backward_graph(key, &graph, &step) : forward_graph(key, &graph, &step);
    if (err.is_bad() && deterministic) {
        fprintf(stderr,
                "warning: cuDNN cannot build a deterministic %s (%s: %s); using the atomic-dQ backward, "
                "whose dq varies in the last bits from run to run\n",
                key_string(key).c_str(), step, err.get_message().c_str());
        built = GraphKey(B, T, H, KV, D, backward, 0);
        fe::error_t retry = backward_graph(built, &graph, &step);
        if (retry.is_bad())
            fe_fail(retry, step, built, __FILE__, __LINE__);
    } else if (err.is_bad()) {
        fe_fail(err, step, built, __FILE__, __LINE__);
    }
    grow_workspace(*graph, built);
    att->graphs[built] = graph;
    att->graphs[key] = graph; /* after a fallback, the deterministic key maps to it too: one warning per shape */
    return *graph;
}

static void execute(const fe::graph::Graph &graph, std::unordered_map<int64_t, void *> &pack, const GraphKey &key,
                    cudaStream_t stream)
{
    CUDNN_CHECK(cudnnSetStream(att->handle, stream));
    fe::error_t err = graph.execute(att->handle, pack, att->workspace);
    if (err.is_bad())
        fe_fail(err, "execute", key, __FILE__, __LINE__);
}

extern "C" {

void attention_setup(void)
{
    if (att != nullptr)
        return;
    att = new AttentionState();
    CUDNN_CHECK(cudnnCreate(&att->handle));
}

void attention_teardown(void)
{
    if (att == nullptr)
        return;
    att->graphs.clear();
    cuda_free(att->workspace);
    CUDNN_CHECK(cudnnDestroy(att->handle));
    delete att;
    att = nullptr;
}

void attention_set_deterministic(int deterministic)
{
    if (att == nullptr)
        FAIL("attention_set_deterministic called before attention_setup()");
    att->deterministic = deterministic != 0;
}

int attention_library_version(void)
{
    return (int)cudnnGetVersion();
}

size_t attention_workspace_bytes(void)
{
    return att != nullptr ? att->workspace_bytes : 0;
}

void attention_forward(bf16 *out, float *stats, const bf16 *qkv, int B, int T, int H, int KV, int D,
                       cudaStream_t stream)
{
    const fe::graph::Graph &graph = get_graph(B, T, H, KV, D, 0);
    bf16 *q = const_cast<bf16 *>(qkv);
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, q}, {UID_K, q + (int64_t)H * D}, {UID_V, q + (int64_t)(H + KV) * D}, {UID_O, out}, {UID_STATS, stats}};
    profile_push(PROF_ATTENTION, stream);
    execute(graph, pack, GraphKey(B, T, H, KV, D, 0, 0), stream);
    profile_pop(stream);
}

void attention_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out, const float *stats, int B,
                        int T, int H, int KV, int D, cudaStream_t stream)
{
    const fe::graph::Graph &graph = get_graph(B, T, H, KV, D, 1);
    bf16 *q = const_cast<bf16 *>(qkv);
    std::unordered_map<int64_t, void *> pack = {{UID_Q, q},
                                                {UID_K, q + (int64_t)H * D},
                                                {UID_V, q + (int64_t)(H + KV) * D},
                                                {UID_O, const_cast<bf16 *>(out)},
                                                {UID_DO, const_cast<bf16 *>(dout)},
                                                {UID_STATS, const_cast<float *>(stats)},
                                                {UID_DQ, dqkv},
                                                {UID_DK, dqkv + (int64_t)H * D},
                                                {UID_DV, dqkv + (int64_t)(H + KV) * D}};
    profile_push(PROF_ATTENTION, stream);
    execute(graph, pack, GraphKey(B, T, H, KV, D, 1, att->deterministic), stream);
    profile_pop(stream);
}

} /* extern "C" */
