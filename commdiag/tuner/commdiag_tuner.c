/*
 * commdiag_tuner.c -- commdiag's NCCL tuner plugin: per-size algorithm/protocol rules.
 *
 * What it owns: reading the rules file named by NCCL_TUNER_CONFIG_FILE (format
 * "# commdiag-tuner-rules 1", docs/tuner.md; commdiag/tuner/rules.py is the same grammar
 * in Python) and, for each collective NCCL asks about, applying the first rule that matches
 * the collective, its size, the communicator's nRanks/nNodes and NCCL's regBuff hint.
 * What it writes: nothing but log lines through NCCL's own logger (prefix "commdiag-tuner:").
 *
 * What it promises NCCL:
 *  - It never fails and never crashes: every entry point returns success (NCCL turns an
 *    error from init into a failed ncclCommInitRank and one from getCollInfo into a failed
 *    collective); a missing, unreadable or malformed file means "no rules" and exactly one
 *    WARN per communicator; reading is bounded (file size, line length, rule count).
 *  - A collective no rule matches is left exactly as NCCL computed it: the cost table and
 *    nChannels are not touched (NCCL's example plugin sets nChannels=1 before matching;
 *    NCCL reads only 0 as "no override", so every unmatched collective runs on one channel).
 *  - A matching rule zeroes the cost of its algo/proto cell only when NCCL has not disabled
 *    that cell (cost < 0); otherwise NCCL's choice stands and the reason is logged.
 *  - State is per communicator (the context init returns); the exported structs are const.
 *
 * Built by commdiag/tuner/build.py: cc -std=c99 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commdiag_tuner_api.h"

#define CT_EXPORT __attribute__((visibility("default")))

/* Limits.  A rules file is written by commdiag from one sweep: a few rules per collective
 * and communicator size.  These bounds are far above that and keep a hostile or mistaken
 * file (a 10 GB log, /dev/zero, a binary) from costing NCCL's init more than ~1 ms. */
#define CT_MAX_FILE_BYTES (1 << 20) /* 1 MiB */
#define CT_MAX_LINE 512             /* bytes per line, newline excluded */
#define CT_MAX_RULES 1024
#define CT_MAX_COUNT 2147483647LL         /* nranks, nnodes */
#define CT_MAX_BYTES 9223372036854775807ULL /* min_bytes, max_bytes: fits size_t and int64 */
/* Per rule and communicator, one INFO line per change of (size, regBuff, outcome), at most
 * this many; a sweep repeats one size hundreds of times, a framework mixes a few sizes. The
 * totals come in one line per fired rule when the communicator is destroyed. */
#define CT_MAX_LOGGED_PER_RULE 64
#define CT_ERR_LEN 256

#define CT_HEADER "# commdiag-tuner-rules "
#define CT_FORMAT_VERSION "1"

enum { CT_MODE_ANY = 0, CT_MODE_GRAPH = 1, CT_MODE_EAGER = 2 };
#define CT_REGBUFF_UNKNOWN (-1) /* ABI v2/v3: NCCL does not say */

static const char* const kCollNames[CT_NUM_FUNCS] = {"broadcast", "reduce", "allgather", "reducescatter",
                                                     "allreduce"};
static const char* const kAlgoNames[CT_NUM_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                                     "nvls", "nvls_tree", "pat"};
static const char* const kProtoNames[CT_NUM_PROTOS] = {"ll", "ll128", "simple"};
static const char* const kModeNames[3] = {"any", "graph", "eager"};

typedef struct {
  int line; /* line number in the file: what every log line names */
  int coll, algo, proto, channels, mode;
  unsigned long long minBytes, maxBytes;
  long long nRanks, nNodes;
  /* per-communicator bookkeeping (the rule lives in one context) */
  unsigned long long applied, refused;
  int logged;
  unsigned long long lastBytes;
  int lastRegBuff, lastOutcome;
} ct_rule_t;

typedef struct {
  ct_logger_t log;
  int abi;
  unsigned long long commId;
  size_t nRanks, nNodes;
  int nRules;
  ct_rule_t rules[]; /* only the rules for this nRanks/nNodes, in file order */
} ct_ctx_t;

/* ---------------------------------------------------------------- logging */

static void ct_log(ct_logger_t log, ct_log_level_t level, unsigned long flags, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void ct_log(ct_logger_t log, ct_log_level_t level, unsigned long flags, int line, const char* fmt, ...) {
  char text[768];
  va_list ap;
  if (log == NULL) return;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  log(level, flags, "commdiag_tuner.c", line, "%s", text);
}

/* A path as the user gave it, fit for a log line: bounded, control bytes shown as '?'. */
static void ct_printable(const char* in, char* out, size_t outLen) {
  size_t i = 0;
  for (; in != NULL && in[i] != '\0' && i + 1 < outLen; i++) {
    unsigned char c = (unsigned char)in[i];
    out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  out[i] = '\0';
}

/* ---------------------------------------------------------------- parsing */

static int ct_lookup(const char* value, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(value, names[i]) == 0) return i;
  return -1;
}

/* Strict decimal: digits only (no sign, no space, no hex), at most 19 of them, <= max. */
static int ct_parse_uint(const char* s, unsigned long long max, unsigned long long* out) {
  unsigned long long v = 0;
  size_t n = strlen(s);
  if (n == 0 || n > 19) return 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + (unsigned long long)(s[i] - '0'); /* 19 digits < 2^64: no overflow */
  }
  if (v > max) return 0;
  *out = v;
  return 1;
}

enum { K_COLL, K_MIN, K_MAX, K_NRANKS, K_NNODES, K_ALGO, K_PROTO, K_CHANNELS, K_MODE, K_NUM };
static const char* const kKeys[K_NUM] = {"coll",   "min_bytes", "max_bytes", "nranks", "nnodes",
                                         "algo",   "proto",     "channels",  "mode"};
#define K_REQUIRED ((1u << K_COLL) | (1u << K_MIN) | (1u << K_MAX) | (1u << K_NRANKS) | (1u << K_NNODES) | \
                    (1u << K_ALGO) | (1u << K_PROTO))

static int ct_is_blank(char c) { return c == ' ' || c == '\t'; }

/* One rule line (already checked for length and bytes) -> rule, or 0 with err set. */
static int ct_parse_rule(char* text, ct_rule_t* r, char* err, size_t errLen) {
  unsigned seen = 0;
  char* p = text;
  memset(r, 0, sizeof *r);
  r->mode = CT_MODE_ANY;
  while (*p != '\0') {
    while (ct_is_blank(*p)) p++;
    if (*p == '\0') break;
    char* tok = p;
    while (*p != '\0' && !ct_is_blank(*p)) p++;
    if (*p != '\0') *p++ = '\0';
    char* eq = strchr(tok, '=');
    if (eq == NULL) {
      snprintf(err, errLen, "'%.40s' is not key=value", tok);
      return 0;
    }
    *eq = '\0';
    char* val = eq + 1;
    int k = ct_lookup(tok, kKeys, K_NUM);
    if (k < 0) {
      snprintf(err, errLen, "unknown key '%.40s' (allowed: coll min_bytes max_bytes nranks nnodes algo proto "
                            "channels mode)", tok);
      return 0;
    }
    if (seen & (1u << k)) {
      snprintf(err, errLen, "key '%s' given twice", kKeys[k]);
      return 0;
    }
    seen |= 1u << k;
    unsigned long long v = 0;
    int ok = 1;
    switch (k) {
      case K_COLL: ok = (r->coll = ct_lookup(val, kCollNames, CT_NUM_FUNCS)) >= 0; break;
      case K_ALGO: ok = (r->algo = ct_lookup(val, kAlgoNames, CT_NUM_ALGOS)) >= 0; break;
      case K_PROTO: ok = (r->proto = ct_lookup(val, kProtoNames, CT_NUM_PROTOS)) >= 0; break;
      case K_MODE: ok = (r->mode = ct_lookup(val, kModeNames, 3)) >= 0; break;
      case K_MIN: ok = ct_parse_uint(val, CT_MAX_BYTES, &r->minBytes); break;
      case K_MAX: ok = ct_parse_uint(val, CT_MAX_BYTES, &r->maxBytes); break;
      case K_NRANKS: ok = ct_parse_uint(val, CT_MAX_COUNT, &v) && v >= 1; r->nRanks = (long long)v; break;
      case K_NNODES: ok = ct_parse_uint(val, CT_MAX_COUNT, &v) && v >= 1; r->nNodes = (long long)v; break;
      case K_CHANNELS: ok = ct_parse_uint(val, CT_MAX_CHANNELS, &v); r->channels = (int)v; break;
    }
    if (!ok) {
      static const char* const allowed[K_NUM] = {
          "broadcast reduce allgather reducescatter allreduce", "an integer 0..2^63-1", "an integer 0..2^63-1",
          "an integer 1..2^31-1", "an integer 1..2^31-1", "tree ring collnet_direct collnet_chain nvls nvls_tree pat",
          "ll ll128 simple", "an integer 0..64 (0: NCCL decides)", "any graph eager"};
      snprintf(err, errLen, "%s='%.40s' (allowed: %s)", kKeys[k], val, allowed[k]);
      return 0;
    }
  }
  if ((seen & K_REQUIRED) != K_REQUIRED) {
    for (int k = 0; k < K_NUM; k++) {
      if ((K_REQUIRED & (1u << k)) && !(seen & (1u << k))) {
        snprintf(err, errLen, "missing key '%s'", kKeys[k]);
        return 0;
      }
    }
  }
  if (r->maxBytes < r->minBytes) {
    snprintf(err, errLen, "max_bytes %llu < min_bytes %llu", r->maxBytes, r->minBytes);
    return 0;
  }
  if (r->nNodes > r->nRanks) {
    snprintf(err, errLen, "nnodes %lld > nranks %lld", r->nNodes, r->nRanks);
    return 0;
  }
  return 1;
}

/* One line of the file (newline removed): header, blank, comment or rule.
 * Returns 1 ok, 0 error (err set).  *isRule says whether r was filled. */
static int ct_parse_line(int lineNo, char* text, size_t len, ct_rule_t* r, int* isRule, char* err, size_t errLen) {
  *isRule = 0;
  if (len > 0 && text[len - 1] == '\r') text[--len] = '\0'; /* CRLF files: one trailing CR */
  if (len > CT_MAX_LINE) {
    snprintf(err, errLen, "line longer than %d bytes", CT_MAX_LINE);
    return 0;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)text[i];
    if (!(c == '\t' || (c >= 0x20 && c < 0x7f))) {
      snprintf(err, errLen, "byte 0x%02x at column %zu (allowed: printable ASCII and tab)", c, i + 1);
      return 0;
    }
  }
  if (lineNo == 1) {
    size_t h = strlen(CT_HEADER);
    if (len >= h && strncmp(text, CT_HEADER, h) == 0) {
      if (strcmp(text + h, CT_FORMAT_VERSION) == 0) return 1;
      snprintf(err, errLen, "format version '%.20s' not supported (this commdiag reads %s: upgrade "
                            "commdiag and rebuild the plugin)", text + h, CT_FORMAT_VERSION);
      return 0;
    }
    snprintf(err, errLen, "first line must be '%s%s'", CT_HEADER, CT_FORMAT_VERSION);
    return 0;
  }
  char* p = text;
  while (ct_is_blank(*p)) p++;
  if (*p == '\0' || *p == '#') return 1;
  if (!ct_parse_rule(p, r, err, errLen)) return 0;
  r->line = lineNo;
  *isRule = 1;
  return 1;
}

/* Reads and parses the whole file.  Returns the number of rules (>= 0) stored in rules[]
 * (capacity CT_MAX_RULES), or -1 with err = "line N: why" / "why". */
static int ct_read_rules(const char* path, ct_rule_t* rules, char* err, size_t errLen) {
  char line[CT_MAX_LINE + 2]; /* the line, its optional CR, NUL */
  char why[CT_ERR_LEN];
  struct stat st;
  int nRules = 0, lineNo = 1, ok = 1;
  size_t len = 0, total = 0;
  int overLong = 0;

  if (path == NULL || path[0] == '\0') {
    snprintf(err, errLen, "NCCL_TUNER_CONFIG_FILE is not set");
    return -1;
  }
  /* O_NONBLOCK: opening a FIFO nobody writes must not hang NCCL's init; then only a
   * regular file is read (not /dev/zero, not a directory). */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errLen, "cannot open: %s", strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errLen, "not a regular file");
    close(fd);
    return -1;
  }
  if (st.st_size > CT_MAX_FILE_BYTES) {
    snprintf(err, errLen, "larger than %d bytes", CT_MAX_FILE_BYTES);
    close(fd);
    return -1;
  }
  FILE* f = fdopen(fd, "rb");
  if (f == NULL) {
    snprintf(err, errLen, "cannot read: %s", strerror(errno));
    close(fd);
    return -1;
  }
  for (;;) {
    int c = getc(f);
    if (c != EOF && ++total > CT_MAX_FILE_BYTES) { /* the file grew while we read it */
      snprintf(err, errLen, "larger than %d bytes", CT_MAX_FILE_BYTES);
      ok = 0;
      break;
    }
    if (c != EOF && c != '\n') {
      if (len < CT_MAX_LINE + 1) line[len++] = (char)c;
      else overLong = 1;
      continue;
    }
    if (c == EOF && len == 0 && !overLong && lineNo > 1) break; /* final newline: no extra line */
    line[len] = '\0'; /* a NUL inside the line is caught by ct_parse_line's byte check (it uses len) */
    if (overLong) snprintf(why, sizeof why, "line longer than %d bytes", CT_MAX_LINE);
    int isRule = 0;
    ct_rule_t r;
    if (overLong || !ct_parse_line(lineNo, line, len, &r, &isRule, why, sizeof why)) {
      snprintf(err, errLen, "line %d: %s", lineNo, why);
      ok = 0;
      break;
    }
    if (isRule) {
      if (nRules == CT_MAX_RULES) {
        snprintf(err, errLen, "line %d: more than %d rules", lineNo, CT_MAX_RULES);
        ok = 0;
        break;
      }
      rules[nRules++] = r;
    }
    if (c == EOF) break;
    lineNo++;
    len = 0;
  }
  if (ok && ferror(f)) {
    snprintf(err, errLen, "read error");
    ok = 0;
  }
  fclose(f);
  return ok ? nRules : -1;
}

/* ---------------------------------------------------------------- plugin core */

static ct_ctx_t* ct_init(int abi, unsigned long long commId, size_t nRanks, size_t nNodes, ct_logger_t log) {
  char err[CT_ERR_LEN + 32];
  char shown[256];
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  ct_rule_t* all = calloc(CT_MAX_RULES, sizeof *all);
  int n = -1, keep = 0, regOnly = 0;

  ct_printable(path, shown, sizeof shown);
  if (all == NULL) snprintf(err, sizeof err, "out of memory");
  else n = ct_read_rules(path, all, err, sizeof err);
  if (n > 0) {
    for (int i = 0; i < n; i++) {
      if ((size_t)all[i].nRanks == nRanks && (size_t)all[i].nNodes == nNodes) all[keep++] = all[i];
    }
  }
  ct_ctx_t* ctx = calloc(1, sizeof *ctx + (size_t)keep * sizeof(ct_rule_t));
  if (ctx == NULL) {
    free(all);
    ct_log(log, CT_LOG_WARN, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
           "commdiag-tuner: out of memory; no rules, NCCL chooses every collective");
    return NULL;
  }
  ctx->log = log;
  ctx->abi = abi;
  ctx->commId = commId;
  ctx->nRanks = nRanks;
  ctx->nNodes = nNodes;
  ctx->nRules = keep;
  if (keep > 0) memcpy(ctx->rules, all, (size_t)keep * sizeof(ct_rule_t));
  for (int i = 0; i < keep; i++) {
    ctx->rules[i].lastOutcome = -1;
    if (ctx->rules[i].mode != CT_MODE_ANY) regOnly++;
  }
  free(all);

  if (n < 0) {
    ct_log(log, CT_LOG_WARN, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
           "commdiag-tuner: NCCL_TUNER_CONFIG_FILE=%s: %s; no rules, NCCL chooses every collective", shown, err);
    return ctx;
  }
  ct_log(log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
         "commdiag-tuner: loaded %d rules from %s, %d for nRanks=%zu nNodes=%zu (comm 0x%llx, tuner ABI v%d)", n,
         shown, keep, nRanks, nNodes, commId, abi);
  if (regOnly > 0 && abi <= 3) {
    ct_log(log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
           "commdiag-tuner: %d rules with mode=graph|eager never match: tuner ABI v%d has no regBuff", regOnly, abi);
  }
  return ctx;
}

/* First rule in file order for this collective, size and regBuff (-1: unknown, only mode=any). */
static ct_rule_t* ct_match(ct_ctx_t* ctx, int coll, size_t nBytes, int regBuff) {
  for (int i = 0; i < ctx->nRules; i++) {
    ct_rule_t* r = &ctx->rules[i];
    if (r->coll != coll || nBytes < r->minBytes || nBytes > r->maxBytes) continue;
    if (r->mode == CT_MODE_GRAPH && regBuff != 1) continue;
    if (r->mode == CT_MODE_EAGER && regBuff != 0) continue;
    return r;
  }
  return NULL;
}

enum { CT_APPLIED = 0, CT_REFUSED_IGNORED = 1, CT_REFUSED_TABLE = 2, CT_REQUESTED = 3 };

/* One INFO line per change of (size, regBuff, outcome) for this rule, bounded.  INIT|TUNING like the init lines:
 * a sweep logs INIT (not TUNING, a line per NCCL call) and still sees which rule fired for which size. */
static void ct_log_outcome(ct_ctx_t* ctx, ct_rule_t* r, int coll, size_t nBytes, int regBuff, int outcome,
                           double was) {
  if (outcome == CT_APPLIED || outcome == CT_REQUESTED) r->applied++;
  else r->refused++;
  if (r->logged > CT_MAX_LOGGED_PER_RULE) return;
  if (r->lastOutcome == outcome && r->lastBytes == nBytes && r->lastRegBuff == regBuff) return;
  r->lastOutcome = outcome;
  r->lastBytes = nBytes;
  r->lastRegBuff = regBuff;
  if (++r->logged > CT_MAX_LOGGED_PER_RULE) {
    ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
           "commdiag-tuner: rule line %d: further applications are counted, not logged", r->line);
    return;
  }
  const char* a = kAlgoNames[r->algo];
  const char* p = kProtoNames[r->proto];
  switch (outcome) {
    case CT_APPLIED:
      ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
             "commdiag-tuner: rule line %d applied: %s nBytes=%zu regBuff=%d -> algo=%s proto=%s channels=%d "
             "(cost was %.3f)", r->line, kCollNames[coll], nBytes, regBuff, a, p, r->channels, was);
      break;
    case CT_REQUESTED:
      ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
             "commdiag-tuner: rule line %d applied: %s nBytes=%zu regBuff=%d -> algo=%s proto=%s channels=%d "
             "(ABI v2: channels not set; NCCL keeps its choice if it disabled this pair)", r->line, kCollNames[coll],
             nBytes, regBuff, a, p, r->channels);
      break;
    case CT_REFUSED_IGNORED:
      ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
             "commdiag-tuner: rule line %d not applied: %s nBytes=%zu regBuff=%d: NCCL disabled algo=%s proto=%s "
             "for this collective (cost %.1f); NCCL's choice stands", r->line, kCollNames[coll], nBytes, regBuff,
             a, p, was);
      break;
    default:
      ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
             "commdiag-tuner: rule line %d not applied: %s nBytes=%zu: algo=%s proto=%s is outside NCCL's cost "
             "table; NCCL's choice stands", r->line, kCollNames[coll], nBytes, a, p);
  }
}

/* The cost-table ABIs (v3..v6).  NCCL passes float[numAlgo][numProto] cast to float**. */
static ct_result_t ct_coll_info(void* context, ct_func_t coll, size_t nBytes, float** collCostTable, int numAlgo,
                                int numProto, int regBuff, int* nChannels) {
  ct_ctx_t* ctx = context;
  if (ctx == NULL || ctx->nRules == 0 || coll < 0 || coll >= CT_NUM_FUNCS) return ct_success;
  ct_rule_t* r = ct_match(ctx, coll, nBytes, regBuff);
  if (r == NULL) return ct_success; /* no rule: cost table and nChannels untouched */
  if (collCostTable == NULL || r->algo >= numAlgo || r->proto >= numProto) {
    ct_log_outcome(ctx, r, coll, nBytes, regBuff, CT_REFUSED_TABLE, 0.0);
    return ct_success;
  }
  float* cell = (float*)collCostTable + (size_t)r->algo * (size_t)numProto + (size_t)r->proto;
  double was = *cell;
  if (!(*cell >= 0.0f)) { /* negative (NCCL_ALGO_PROTO_IGNORE) or NaN: NCCL will not run it */
    ct_log_outcome(ctx, r, coll, nBytes, regBuff, CT_REFUSED_IGNORED, was);
    return ct_success;
  }
  *cell = 0.0f;
  if (r->channels > 0 && nChannels != NULL) *nChannels = r->channels;
  ct_log_outcome(ctx, r, coll, nBytes, regBuff, CT_APPLIED, was);
  return ct_success;
}

static ct_result_t ct_finalize(void* context) {
  ct_ctx_t* ctx = context;
  if (ctx == NULL) return ct_success;
  for (int i = 0; i < ctx->nRules; i++) {
    const ct_rule_t* r = &ctx->rules[i];
    if (r->applied == 0 && r->refused == 0) continue;
    ct_log(ctx->log, CT_LOG_INFO, CT_SUBSYS_INIT | CT_SUBSYS_TUNING, __LINE__,
           "commdiag-tuner: comm 0x%llx: rule line %d applied %llu times, not applied %llu times", ctx->commId,
           r->line, r->applied, r->refused);
  }
  free(ctx);
  return ct_success;
}

/* ---------------------------------------------------------------- the ABI versions */

static ct_result_t ct_init_v5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ct_logger_t log,
                              ct_nvl_domain_info_t* nvl, ct_tuner_constants_t* constants) {
  (void)nvl;
  (void)constants; /* NCCL's model constants are left as NCCL set them */
  if (ctx != NULL) *ctx = ct_init(5, commId, nRanks, nNodes, log);
  return ct_success;
}

static ct_result_t ct_init_v6(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ct_logger_t log,
                              ct_nvl_domain_info_t* nvl, ct_tuner_constants_t* constants) {
  (void)nvl;
  (void)constants;
  if (ctx != NULL) *ctx = ct_init(6, commId, nRanks, nNodes, log);
  return ct_success;
}

static ct_result_t ct_init_v4(size_t nRanks, size_t nNodes, ct_logger_t log, void** ctx) {
  if (ctx != NULL) *ctx = ct_init(4, 0, nRanks, nNodes, log);
  return ct_success;
}

static ct_result_t ct_init_v3(size_t nRanks, size_t nNodes, ct_logger_t log, void** ctx) {
  if (ctx != NULL) *ctx = ct_init(3, 0, nRanks, nNodes, log);
  return ct_success;
}

static ct_result_t ct_init_v2(size_t nRanks, size_t nNodes, ct_logger_t log, void** ctx) {
  if (ctx != NULL) *ctx = ct_init(2, 0, nRanks, nNodes, log);
  return ct_success;
}

static ct_result_t ct_coll_info_regbuff(void* ctx, ct_func_t coll, size_t nBytes, int numPipeOps,
                                        float** collCostTable, int numAlgo, int numProto, int regBuff,
                                        int* nChannels) {
  (void)numPipeOps;
  return ct_coll_info(ctx, coll, nBytes, collCostTable, numAlgo, numProto, regBuff ? 1 : 0, nChannels);
}

static ct_result_t ct_coll_info_v3(void* ctx, ct_func_t coll, size_t nBytes, int numPipeOps, float** collCostTable,
                                   int numAlgo, int numProto, int* nChannels) {
  (void)numPipeOps;
  return ct_coll_info(ctx, coll, nBytes, collCostTable, numAlgo, numProto, CT_REGBUFF_UNKNOWN, nChannels);
}

static ct_result_t ct_coll_info_v2(void* context, ct_func_t coll, size_t nBytes, int collNetSupport, int nvlsSupport,
                                   int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  ct_ctx_t* ctx = context;
  (void)collNetSupport;
  (void)nvlsSupport;
  (void)numPipeOps;
  if (ctx == NULL || ctx->nRules == 0 || coll < 0 || coll >= CT_NUM_FUNCS) return ct_success;
  ct_rule_t* r = ct_match(ctx, coll, nBytes, CT_REGBUFF_UNKNOWN);
  if (r == NULL || algorithm == NULL || protocol == NULL) return ct_success;
  *algorithm = r->algo;
  *protocol = r->proto;
  /* nChannels is left alone: NCCL's v2 adapter may drop the pair (ignored cell) without telling us,
   * and the rule's channel count was measured for its own algo/proto, not for NCCL's fallback. */
  (void)nChannels;
  ct_log_outcome(ctx, r, coll, nBytes, CT_REGBUFF_UNKNOWN, CT_REQUESTED, 0.0);
  return ct_success;
}

#define CT_NAME "commdiag"

/* Newest first: NCCL 2.30 takes v6, 2.28-2.29 v5, 2.24-2.27 v4 (src/plugin/tuner.cc). */
CT_EXPORT const ct_tuner_v6_t ncclTunerPlugin_v6 = {CT_NAME, ct_init_v6, ct_coll_info_regbuff, ct_finalize, NULL};
CT_EXPORT const ct_tuner_v5_t ncclTunerPlugin_v5 = {CT_NAME, ct_init_v5, ct_coll_info_regbuff, ct_finalize};
CT_EXPORT const ct_tuner_v4_t ncclTunerPlugin_v4 = {CT_NAME, ct_init_v4, ct_coll_info_regbuff, ct_finalize};
CT_EXPORT const ct_tuner_v3_t ncclTunerPlugin_v3 = {CT_NAME, ct_init_v3, ct_coll_info_v3, ct_finalize};
CT_EXPORT const ct_tuner_v2_t ncclTunerPlugin_v2 = {CT_NAME, ct_init_v2, ct_coll_info_v2, ct_finalize};

/* ---------------------------------------------------------------- for commdiag, not NCCL */

/* commdiag_tuner_check(path, out, outLen): parse like init does and write the canonical
 * form of every rule (one per line, keys in the order of docs/tuner.md), or "error: WHY".
 * Returns the rule count, or -1.  commdiag's tests compare it with rules.py's parser. */
CT_EXPORT int commdiag_tuner_check(const char* path, char* out, size_t outLen) {
  char err[CT_ERR_LEN + 32];
  size_t used = 0;
  if (out == NULL || outLen == 0) return -1;
  out[0] = '\0';
  ct_rule_t* rules = calloc(CT_MAX_RULES, sizeof *rules);
  if (rules == NULL) {
    snprintf(out, outLen, "error: out of memory");
    return -1;
  }
  int n = ct_read_rules(path, rules, err, sizeof err);
  if (n < 0) {
    snprintf(out, outLen, "error: %s", err);
  } else {
    for (int i = 0; i < n && used < outLen; i++) {
      const ct_rule_t* r = &rules[i];
      int w = snprintf(out + used, outLen - used,
                       "line=%d coll=%s min_bytes=%llu max_bytes=%llu nranks=%lld nnodes=%lld algo=%s proto=%s "
                       "channels=%d mode=%s\n", r->line, kCollNames[r->coll], r->minBytes, r->maxBytes, r->nRanks,
                       r->nNodes, kAlgoNames[r->algo], kProtoNames[r->proto], r->channels, kModeNames[r->mode]);
      if (w < 0) break;
      used += (size_t)w;
    }
  }
  free(rules);
  return n;
}
