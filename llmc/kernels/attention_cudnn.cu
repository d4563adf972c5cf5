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
 * Packed documents (AttentionDocs): the same views with B = the document
 * slots and T = the longest document (rounded), each tensor's batch stride
 * replaced by a ragged offset per document (Q, K, V, dQ, dK, dV share one
 * array, O and dO another, the token-major [N, H] stats a third), and a padding
 * mask of the documents' lengths under the causal one, so each document is a
 * sequence of its own.
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

#include "llmc/kernels/attention.h"
#include "llmc/common/cuda_common.h"
#include "llmc/common/profile.h"

namespace fe = cudnn_frontend;

enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_SEQ_LEN_Q, /* packed documents: */
    UID_SEQ_LEN_KV,
    UID_QKV_OFFSETS,
    UID_OUT_OFFSETS,
    UID_STATS_OFFSETS
};

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

/* B, T, H, KV, D, backward, deterministic, ragged: packed documents' tokens in all (0: none; then B is their slots
 * and T the longest) */
typedef std::tuple<int, int, int, int, int, int, int, int> GraphKey;

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
    snprintf(s, sizeof(s), "%s attention %s=%d T=%d H=%d KV=%d D=%d%s", std::get<5>(k) ? "backward" : "forward",
             std::get<7>(k) ? "packed documents, slots" : "B", std::get<0>(k), std::get<1>(k), std::get<2>(k),
             std::get<3>(k), std::get<4>(k),
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
/* stats: [B, H, T] dense; token-major [N, H] (H innermost) with packed documents */
static std::vector<int64_t> stats_stride(int64_t T, int64_t H, bool ragged)
{
    if (ragged)
        return {H * T, 1, H, 1};
    return {H * T, T, 1, 1};
}

/* The packed documents' index tensors: [n, 1, 1, 1] int32. */
static std::shared_ptr<fe::graph::Tensor_attributes> index_tensor(fe::graph::Graph &graph, const char *name,
                                                                  int64_t uid, int64_t n)
{
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({n, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
}

struct RaggedInputs {
    std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv, qkv, out, stats;
};

/* With packed documents: the index tensors, the ragged offsets set on Q, K, V; else all null. */
static RaggedInputs ragged_inputs(fe::graph::Graph &graph, int64_t slots, bool ragged,
                                  std::shared_ptr<fe::graph::Tensor_attributes> Q,
                                  std::shared_ptr<fe::graph::Tensor_attributes> K,
                                  std::shared_ptr<fe::graph::Tensor_attributes> V)
{
    RaggedInputs r;
    if (!ragged)
        return r;
    r.seq_q = index_tensor(graph, "seq_len_q", UID_SEQ_LEN_Q, slots);
    r.seq_kv = index_tensor(graph, "seq_len_kv", UID_SEQ_LEN_KV, slots);
    r.qkv = index_tensor(graph, "qkv_offsets", UID_QKV_OFFSETS, slots + 1);
    r.out = index_tensor(graph, "out_offsets", UID_OUT_OFFSETS, slots + 1);
    r.stats = index_tensor(graph, "stats_offsets", UID_STATS_OFFSETS, slots + 1);
    Q->set_ragged_offset(r.qkv);
    K->set_ragged_offset(r.qkv);
    V->set_ragged_offset(r.qkv);
    return r;
}

static fe::error_t forward_graph(const GraphKey &key, std::shared_ptr<fe::graph::Graph> *built, const char **step)
{
    int64_t B = std::get<0>(key), T = std::get<1>(key), H = std::get<2>(key), KV = std::get<3>(key),
            D = std::get<4>(key), NH = H + 2 * KV;
    bool ragged = std::get<7>(key) != 0;
    auto graph = new_graph();
    auto Q = graph->tensor(qkv_view("Q", UID_Q, B, H, T, D, NH));
    auto K = graph->tensor(qkv_view("K", UID_K, B, KV, T, D, NH));
    auto V = graph->tensor(qkv_view("V", UID_V, B, KV, T, D, NH));
    RaggedInputs r = ragged_inputs(*graph, B, ragged, Q, K, V);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sdpa_forward")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(1.0f / sqrtf((float)D));
    if (ragged) /* the total sizes the workspace to the tokens there are, not to slots x T */
        options.set_padding_mask(true)
            .set_seq_len_q(r.seq_q)
            .set_seq_len_kv(r.seq_kv)
            .set_max_total_seq_len_q(std::get<7>(key))
            .set_max_total_seq_len_kv(std::get<7>(key));
    auto [O, Stats] = graph->sdpa(Q, K, V, options);
    O->set_output(true).set_uid(UID_O).set_dim({B, H, T, D}).set_stride(out_stride(T, H, D));
    Stats->set_output(true)
        .set_uid(UID_STATS)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, H, T, 1})
        .set_stride(stats_stride(T, H, ragged));
    if (ragged) {
        O->set_ragged_offset(r.out);
        Stats->set_ragged_offset(r.stats);
    }
    *built = graph;
    return build(*graph, step);
}

static fe::error_t backward_graph(const GraphKey &key, std::shared_ptr<fe::graph::Graph> *built, const char **step)
{
    int64_t B = std::get<0>(key), T = std::get<1>(key), H = std::get<2>(key), KV = std::get<3>(key),
            D = std::get<4>(key), NH = H + 2 * KV;
    bool deterministic = std::get<6>(key) != 0, ragged = std::get<7>(key) != 0;
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
                                   .set_stride(stats_stride(T, H, ragged))
                                   .set_data_type(fe::DataType_t::FLOAT));
    RaggedInputs r = ragged_inputs(*graph, B, ragged, Q, K, V);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(1.0f / sqrtf((float)D))
                       .set_deterministic_algorithm(deterministic);
    if (ragged) {
        O->set_ragged_offset(r.out);
        dO->set_ragged_offset(r.out);
        Stats->set_ragged_offset(r.stats);
        options.set_padding_mask(true)
            .set_seq_len_q(r.seq_q)
            .set_seq_len_kv(r.seq_kv)
            .set_max_total_seq_len_q(std::get<7>(key))
            .set_max_total_seq_len_kv(std::get<7>(key));
    }
    auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, options);
    dQ->set_output(true).set_uid(UID_DQ).set_dim({B, H, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    dK->set_output(true).set_uid(UID_DK).set_dim({B, KV, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    dV->set_output(true).set_uid(UID_DV).set_dim({B, KV, T, D}).set_stride({T * NH * D, D, NH * D, 1});
    if (ragged) {
        dQ->set_ragged_offset(r.qkv);
        dK->set_ragged_offset(r.qkv);
        dV->set_ragged_offset(r.qkv);
    }
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

static const fe::graph::Graph &get_graph(int B, int T, int H, int KV, int D, int backward, int ragged)
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
    GraphKey key(B, T, H, KV, D, backward, deterministic, ragged);
    auto found = att->graphs.find(key);
    if (found != att->graphs.end())
        return *found->second;
    /* The deterministic backward holds dP for every slot at the longest document's length: many short documents
     * beside one long one can ask more than the whole dense batch did. Past the limit, the atomic one. */
    GraphKey built = key;
    if (deterministic && ragged && !attention_deterministic_fits(B, H, T)) {
        fprintf(stderr,
                "note: %s: the deterministic backward's dP workspace would pass %.0f GiB; using the atomic-dQ "
                "backward for this shape (dq varies in the last bits from run to run)\n",
                key_string(key).c_str(), ATTENTION_DETERMINISTIC_MAX_BYTES / 1073741824.0);
        built = GraphKey(B, T, H, KV, D, backward, 0, ragged);
        deterministic = 0;
    }
    const char *step = "";
    std::shared_ptr<fe::graph::Graph> graph;
    fe::error_t err = backward ? backward_graph(built, &graph, &step) : forward_graph(built, &graph, &step);
    if (err.is_bad() && deterministic) {
        fprintf(stderr,
                "warning: cuDNN cannot build a deterministic %s (%s: %s); using the atomic-dQ backward, "
                "whose dq varies in the last bits from run to run\n",
                key_string(key).c_str(), step, err.get_message().c_str());
        built = GraphKey(B, T, H, KV, D, backward, 0, ragged);
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

__global__ void documents_offsets_kernel(int *qkv_offsets, int *out_offsets, int *stats_offsets, const int *start,
                                         int n, int qkv_stride, int out_stride, int heads)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        qkv_offsets[i] = start[i] * qkv_stride;
        out_offsets[i] = start[i] * out_stride;
        stats_offsets[i] = start[i] * heads;
    }
}

void attention_documents_offsets(AttentionDocs *docs, int H, int KV, int D, cudaStream_t stream)
{
    int n = docs->slots + 1;
    profile_push(PROF_ATTENTION, stream); /* every launcher marks its work (profile.h) */
    documents_offsets_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(
        docs->qkv_offsets, docs->out_offsets, docs->stats_offsets, docs->start, n, (H + 2 * KV) * D, H * D, H);
    CUDA_CHECK_LAST();
    profile_pop(stream);
}

/* The graph's batch and sequence sizes, and the index tensors of packed documents in pack. */
static void documents_bind(const AttentionDocs *docs, int B, int T, int H, int KV, int D, int *graph_B, int *graph_T,
                           std::unordered_map<int64_t, void *> &pack)
{
    *graph_B = B;
    *graph_T = T;
    if (docs == NULL)
        return;
    if ((int64_t)B * T * (H + 2 * KV) * D >= ((int64_t)1 << 31))
        FAIL("attention: packed documents over B*T = %lld tokens of %d heads x %d: element offsets past 2^31, which "
             "cuDNN's int32 ragged offsets cannot hold\n  hint: lower B or T",
             (long long)B * T, H + 2 * KV, D);
    if (docs->slots <= 0 || docs->max_len <= 0 || docs->max_len > T)
        FAIL("attention: packed documents with %d slots and longest %d (T = %d)", docs->slots, docs->max_len, T);
    *graph_B = docs->slots;
    *graph_T = docs->max_len;
    pack[UID_SEQ_LEN_Q] = docs->seq_len;
    pack[UID_SEQ_LEN_KV] = docs->seq_len;
    pack[UID_QKV_OFFSETS] = docs->qkv_offsets;
    pack[UID_OUT_OFFSETS] = docs->out_offsets;
    pack[UID_STATS_OFFSETS] = docs->stats_offsets;
}

void attention_forward(bf16 *out, float *stats, const bf16 *qkv, int B, int T, int H, int KV, int D,
                       const AttentionDocs *docs, cudaStream_t stream)
{
    bf16 *q = const_cast<bf16 *>(qkv);
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, q}, {UID_K, q + (int64_t)H * D}, {UID_V, q + (int64_t)(H + KV) * D}, {UID_O, out}, {UID_STATS, stats}};
    int gB, gT, ragged = docs != NULL ? B * T : 0;
    documents_bind(docs, B, T, H, KV, D, &gB, &gT, pack);
    const fe::graph::Graph &graph = get_graph(gB, gT, H, KV, D, 0, ragged);
    profile_push(PROF_ATTENTION, stream);
    execute(graph, pack, GraphKey(gB, gT, H, KV, D, 0, 0, ragged), stream);
    profile_pop(stream);
}

void attention_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out, const float *stats, int B,
                        int T, int H, int KV, int D, const AttentionDocs *docs, cudaStream_t stream)
{
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
    int gB, gT, ragged = docs != NULL ? B * T : 0;
    documents_bind(docs, B, T, H, KV, D, &gB, &gT, pack);
    const fe::graph::Graph &graph = get_graph(gB, gT, H, KV, D, 1, ragged);
    profile_push(PROF_ATTENTION, stream);
    execute(graph, pack, GraphKey(gB, gT, H, KV, D, 1, att->deterministic, ragged), stream);
    profile_pop(stream);
}

} /* extern "C" */
