/* psrt's C API: the one entry point every framework plugin shares.
 *
 * Functions return 0 (or a handle > 0) on success and a negative absl status
 * code on failure; psrt_last_error() then says why, for this thread. No
 * exception ever crosses this boundary. */
#ifndef PSRT_WORKER_C_API_H_
#define PSRT_WORKER_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct psrt_client psrt_client;

/* Server-side optimizer settings with PyTorch's names. */
typedef struct {
  const char* name; /* "sgd", "adam", "adamw", "adagrad", "ftrl", "assign" */
  double lr, momentum, dampening;
  int nesterov;
  double weight_decay, beta1, beta2, eps, lr_decay, initial_accumulator_value;
  double l1, l2, ftrl_beta; /* ftrl */
} psrt_optimizer;

/* Fills `out` with PyTorch's defaults for optimizer `name`. */
int psrt_optimizer_defaults(const char* name, double lr, psrt_optimizer* out);

/* Connects using the environment psrt-worker sets (PSRT_COORDINATOR,
 * PSRT_RANK, PSRT_JOB_TOKEN). Returns NULL on failure. */
psrt_client* psrt_connect_from_env(void);
void psrt_close(psrt_client* client);
/* The training is done: sends this process's totals to the coordinator (the
 * job's summary); psrt_close does too. The client stays usable. */
void psrt_finish(psrt_client* client);

int psrt_rank(const psrt_client* client);
int psrt_num_workers(const psrt_client* client);
/* Workers taking part now: fewer than psrt_num_workers once some left or, in
 * an elastic job, before all joined. */
int psrt_active_workers(const psrt_client* client);
int psrt_num_servers(const psrt_client* client);
int psrt_is_sync(const psrt_client* client);
/* 1 if the servers apply the mean of a sync step's pushes (the job's
 * gradient_aggregation "mean"), 0 if their sum. */
int psrt_averages(const psrt_client* client);
/* The step a job started from a checkpoint resumes at; 0 for a fresh job. */
int64_t psrt_restored_step(const psrt_client* client);
/* 0 if every sync step waits for every worker's push (collectives through
 * the servers sum over the job's workers); otherwise a negative status code,
 * and psrt_last_error says which option of the job prevents it. */
int psrt_every_worker_each_step(const psrt_client* client);

/* How a variable's values travel (psrt_register). */
enum {
  PSRT_COMPRESSION_JOB_DEFAULT = 0, /* the job's compression / pull_compression */
  PSRT_COMPRESSION_NONE = 1,
  PSRT_COMPRESSION_FP16 = 2,
  PSRT_COMPRESSION_BF16 = 3
};

/* Registers a float32 variable (host memory); `data` then holds the current
 * weights: rank 0's initial value, or those of a restored checkpoint.
 * `push_compression` and `pull_compression` are PSRT_COMPRESSION_*. */
int psrt_register(psrt_client* client, const char* name, const int64_t* shape, int ndim,
                  float* data, const psrt_optimizer* optimizer, int push_compression,
                  int pull_compression);

/* A sparse table: rows of `dim` floats keyed by int64 ids (docs/sparse.md).
 * vocab > 0: ids in [0, vocab); 0: an open hash table. New rows are
 * N(0, init_std^2) drawn from (seed, id). max_rows caps rows per server;
 * evict_after_steps and evict_min_count (open hash tables) drop unused rows;
 * 0 turns each off. */
typedef struct {
  int64_t dim, vocab;
  uint64_t seed;
  double init_std;
  int64_t max_rows, evict_after_steps, evict_min_count;
  int push_compression, pull_compression; /* PSRT_COMPRESSION_* */
} psrt_table;

/* Registers a table on every server (every rank, with the same settings).
 * The optimizer is row-wise: sgd, adagrad, adam (lazy, as torch's
 * SparseAdam) or ftrl. */
int psrt_register_table(psrt_client* client, const char* name, const psrt_table* table,
                        const psrt_optimizer* optimizer);
/* Pulls the rows of n distinct ids into out (n * dim floats, host memory),
 * at least at min_version (sync: the step). */
int64_t psrt_pull_rows(psrt_client* client, const char* table, const int64_t* ids, int64_t n,
                       float* out, int64_t min_version);
/* Pushes the gradients (n * dim floats) of n distinct ids' rows, computed
 * at `version`. Sync: every worker pushes once per step, n may be 0; the
 * part for a server not pulled from at `version` waits for the step there. */
int64_t psrt_push_rows(psrt_client* client, const char* table, const int64_t* ids, int64_t n,
                       const float* grads, int64_t version);

/* Before a table's first step: the rows of n ids take values (n * dim floats),
 * with fresh optimizer state; blocks until the servers hold them. */
int psrt_assign_rows(psrt_client* client, const char* table, const int64_t* ids, int64_t n,
                     const float* values);

/* Asynchronous operations over n variables; buffers must live until
 * psrt_wait returns. A NULL gradient among `grads` says the variable has no
 * gradient this step (its parameter took no part in the loss): in a sync
 * step no worker had one for, its weights and optimizer state stay as they
 * were (as a framework's optimizer skips it) while its version advances;
 * where some workers had one, the others count as zeros in the mean (a
 * host's processes summing first add only those that had one). */
int64_t psrt_push(psrt_client* client, int n, const char* const* names, const float* const* grads,
                  int64_t version);
int64_t psrt_pull(psrt_client* client, int n, const char* const* names, float* const* out,
                  int64_t min_version);
int64_t psrt_push_pull(psrt_client* client, int n, const char* const* names,
                       const float* const* grads, float* const* out, int64_t version);
int psrt_wait(psrt_client* client, int64_t handle);

/* The version of `name` its latest pull returned (sync: the step to push
 * next); negative on error. */
int64_t psrt_pulled_version(psrt_client* client, const char* name);

/* The step of `name`'s next push after one for `last` (< 0: its first):
 * sync, the servers' step (psrt_pulled_version); async and ssp, this
 * worker's clock from the restored step. Negative on error. */
int64_t psrt_next_step(psrt_client* client, const char* name, int64_t last);

/* How psrt_allreduce combines the workers' tensors. */
enum { PSRT_REDUCE_MEAN = 0, PSRT_REDUCE_SUM = 1 };

/* The workers' mean (a worker without the tensor counting as zeros, as
 * under DDP) or sum of n float32 tensors of sizes[i] values each: the one
 * rule behind every plugin's mean gradient, its collectives and the
 * decisions the workers take together (worker/reducer.h). in[i] NULL says
 * this worker has none this step; out[i] is host memory; given[i] (given may
 * be NULL) becomes 1 where any worker had the tensor, else 0 with out[i]
 * zeros. Blocks until every worker's share is in. Sync jobs only; every
 * worker makes the same calls in the same order; PSRT_REDUCE_SUM on
 * averaging servers needs every worker each step. `compression` is how the
 * shares travel (PSRT_COMPRESSION_*); the result comes back exact. *factor
 * (may be NULL) becomes the servers' aggregate over the workers' mean: 1
 * where they average, the number of workers that pushed where they sum. */
int psrt_allreduce(psrt_client* client, int n, const char* const* names, const int64_t* sizes,
                   const float* const* in, float* const* out, int* given, int op, int compression,
                   int* factor);

/* 0 where the weights and optimizer state may live on the workers, each
 * applying its own optimizer to psrt_allreduce's mean gradient; otherwise a
 * negative status code, and psrt_last_error says which option prevents it.
 * `saves_state`: the plugin keeps its state with psrt_state_save (else
 * checkpoints and restore prevent it too). */
int psrt_state_on_workers(const psrt_client* client, int saves_state);

/* The workers' own state where the optimizer runs on the workers (weights
 * and optimizer state as the plugin serializes them), kept in the servers'
 * keys so that the job's checkpoints save it once and a restore gives it
 * back (worker/state_keys.h). psrt_state_load, every worker at start: sets
 * *size to the bytes of the state `name` the job restored (0: none) and
 * copies them to `buf` where `capacity` holds them (call again with a buffer
 * that large: the bytes are kept until then). psrt_state_save: rank 0's
 * state of `step` (other ranks: nothing); blocks until the servers hold it.
 * psrt_state_due: 1 if a checkpoint of the job saves `step` (a multiple of
 * its every_steps; with `last` set, the last step, which the job's final
 * checkpoint saves), so rank 0 saves the state of that step; else 0. */
int psrt_state_load(psrt_client* client, const char* name, void* buf, int64_t capacity,
                    int64_t* size);
int psrt_state_save(psrt_client* client, const char* name, const void* bytes, int64_t size,
                    int64_t step);
int psrt_state_due(const psrt_client* client, int64_t step, int last);

/* 0 if every worker's `digest` (of its weights, say) is rank 0's; otherwise
 * a negative status code and psrt_last_error names the workers whose `what`
 * differs. Every worker calls it at the same point of a sync job. */
int psrt_check_same(psrt_client* client, const char* what, uint32_t digest);

/* Sets the learning rate of `variable`, or of every dense variable when
 * NULL (a table keeps its own until set by name); sends nothing where the
 * servers hold that rate already. */
int psrt_set_learning_rate(psrt_client* client, const char* variable, double lr);

/* The last error of this thread, or "" if none. */
const char* psrt_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PSRT_WORKER_C_API_H_ */
