/*
 * commdiag_tuner_api.h -- the parts of NCCL's tuner-plugin ABI that commdiag's tuner needs.
 *
 * Written for commdiag from the layouts in NVIDIA/nccl (not copied): src/include/plugin/tuner/
 * tuner_v2.h .. tuner_v6.h, src/include/plugin/nccl_tuner.h, src/include/nccl_common.h,
 * src/plugin/tuner.cc (the loader) and src/enqueue.cc (how getCollInfo is called).
 * Only layouts and values matter to the ABI; names here are commdiag's own (ct_ prefix) so
 * this header can never clash with a real nccl.h.
 *
 * Which NCCL looks for which symbol (dlsym on the library named by NCCL_TUNER_PLUGIN,
 * newest first, the first one found wins):
 *
 *   symbol               first NCCL    looked for by (first choice)
 *   ncclTunerPlugin_v6   2.30.3        2.30.x
 *   ncclTunerPlugin_v5   2.28.3        2.28.x, 2.29.x  (2.28.9 on our H200s looks for v5 first)
 *   ncclTunerPlugin_v4   2.24.3        2.24.x .. 2.27.x
 *   ncclTunerPlugin_v3   2.22.3        2.22.x, 2.23.x
 *   ncclTunerPlugin_v2   2.21.5        2.21.x
 *
 * Every NCCL from 2.24 to 2.30 still falls back to the older symbols through adapters.
 */
#ifndef COMMDIAG_TUNER_API_H
#define COMMDIAG_TUNER_API_H

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t: only success is ever returned -- NCCL wraps init and getCollInfo in
 * NCCLCHECK, so an error from init fails communicator creation and an error from
 * getCollInfo fails the collective (src/init.cc, src/enqueue.cc in 2.28.9). */
typedef enum { ct_success = 0, ct_internal_error = 3 } ct_result_t;

/* ncclDebugLogLevel (nccl_common.h, unchanged 2.24 .. 2.30). */
typedef enum {
  CT_LOG_NONE = 0,
  CT_LOG_VERSION = 1,
  CT_LOG_WARN = 2,
  CT_LOG_INFO = 3,
  CT_LOG_ABORT = 4,
  CT_LOG_TRACE = 5
} ct_log_level_t;

/* ncclDebugLogSubSys bits we log under.  NCCL prints a line only when its flags meet
 * NCCL_DEBUG_SUBSYS (default INIT,BOOTSTRAP,ENV) -- WARN lines included (debug.cc). */
#define CT_SUBSYS_INIT 0x1UL
#define CT_SUBSYS_TUNING 0x40UL

/* ncclDebugLogger_t: printf-like.  We always call it as (..., "%s", text) so that the one
 * variadic argument is a pointer and no user text is ever used as a format. */
typedef void (*ct_logger_t)(ct_log_level_t level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...);

/* ncclFunc_t: the collectives a tuner is asked about (values 0..4, stable 2.24 .. 2.30). */
enum {
  CT_FUNC_BROADCAST = 0,
  CT_FUNC_REDUCE = 1,
  CT_FUNC_ALLGATHER = 2,
  CT_FUNC_REDUCESCATTER = 3,
  CT_FUNC_ALLREDUCE = 4,
  CT_NUM_FUNCS = 5
};
typedef int ct_func_t; /* an enum argument: passed as int on every ABI NCCL supports */

/* Cost-table indices (NCCL_ALGO_*, NCCL_PROTO_*), 7 x 3 in 2.24 .. 2.30. */
enum {
  CT_ALGO_TREE = 0,
  CT_ALGO_RING = 1,
  CT_ALGO_COLLNET_DIRECT = 2,
  CT_ALGO_COLLNET_CHAIN = 3,
  CT_ALGO_NVLS = 4,
  CT_ALGO_NVLS_TREE = 5,
  CT_ALGO_PAT = 6,
  CT_NUM_ALGOS = 7
};
enum { CT_PROTO_LL = 0, CT_PROTO_LL128 = 1, CT_PROTO_SIMPLE = 2, CT_NUM_PROTOS = 3 };

/* NCCL_ALGO_PROTO_IGNORE: a cell NCCL will not use.  NCCL picks the smallest cost >= 0, so
 * any negative cell is out of the running. */
#define CT_COST_IGNORE (-1.0f)

/* MAXCHANNELS: 32 in 2.24, 64 from 2.28 (src/include/device.h); NCCL clamps the tuner's
 * nChannels to what the communicator has.  0 means "NCCL decides". */
#define CT_MAX_CHANNELS 64

/* v5/v6 init arguments (tuner_v5.h).  We never read or write the constants; the layout is
 * declared so the pointer type is honest. */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ct_nvl_domain_info_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} ct_tuner_constants_t;

/* ---- The plugin structs, one per ABI version.  Field order is the ABI. ---- */

/* v6 (NCCL 2.30): v5 plus an optional getChunkSize (NULL = keep NCCL's chunk size). */
typedef struct {
  const char* name;
  ct_result_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ct_logger_t logFunction,
                      ct_nvl_domain_info_t* nvlDomainInfo, ct_tuner_constants_t* constants);
  ct_result_t (*getCollInfo)(void* ctx, ct_func_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                             int numAlgo, int numProto, int regBuff, int* nChannels);
  ct_result_t (*finalize)(void* ctx);
  ct_result_t (*getChunkSize)(void* ctx, ct_func_t collType, size_t nBytes, int algo, int proto, int nChannels,
                              size_t* chunkSize);
} ct_tuner_v6_t;

/* v5 (NCCL 2.28): init gains commId, NVL domain info and the tuning constants (in/out);
 * destroy is renamed finalize (same slot). */
typedef struct {
  const char* name;
  ct_result_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ct_logger_t logFunction,
                      ct_nvl_domain_info_t* nvlDomainInfo, ct_tuner_constants_t* constants);
  ct_result_t (*getCollInfo)(void* ctx, ct_func_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                             int numAlgo, int numProto, int regBuff, int* nChannels);
  ct_result_t (*finalize)(void* ctx);
} ct_tuner_v5_t;

/* v4 (NCCL 2.24): v3 plus regBuff, NCCL's hint that the user buffers are registered or that
 * a CUDA graph is being captured with NCCL_GRAPH_REGISTER=1 (the default). */
typedef struct {
  const char* name;
  ct_result_t (*init)(size_t nRanks, size_t nNodes, ct_logger_t logFunction, void** ctx);
  ct_result_t (*getCollInfo)(void* ctx, ct_func_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                             int numAlgo, int numProto, int regBuff, int* nChannels);
  ct_result_t (*destroy)(void* ctx);
} ct_tuner_v4_t;

/* v3 (NCCL 2.22): the cost table arrives; no regBuff. */
typedef struct {
  const char* name;
  ct_result_t (*init)(size_t nRanks, size_t nNodes, ct_logger_t logFunction, void** ctx);
  ct_result_t (*getCollInfo)(void* ctx, ct_func_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                             int numAlgo, int numProto, int* nChannels);
  ct_result_t (*destroy)(void* ctx);
} ct_tuner_v3_t;

/* v2 (NCCL 2.21): no cost table; the plugin names an algorithm and a protocol (-1 = NCCL
 * decides) and NCCL's adapter zeroes that cell unless it is ignored. */
typedef struct {
  const char* name;
  ct_result_t (*init)(size_t nRanks, size_t nNodes, ct_logger_t logFunction, void** ctx);
  ct_result_t (*getCollInfo)(void* ctx, ct_func_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                             int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ct_result_t (*destroy)(void* ctx);
} ct_tuner_v2_t;

/* commdiag's own export, not part of NCCL's ABI: parse a rules file as init does and write the
 * canonical rules (or "error: WHY") into out; returns the rule count or -1 (commdiag_tuner.c). */
int commdiag_tuner_check(const char* path, char* out, size_t outLen);

#endif
