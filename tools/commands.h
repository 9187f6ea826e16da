/* commands.h: the subcommands of the tessera command, one function each.
 * Each takes the arguments after its name's words (argv[0] is the last word of
 * the command name, e.g. "codec" for `tessera bench codec`) and returns the
 * process exit status: 0 success, 1 failure, 2 bad usage. */
#ifndef TSR_COMMANDS_H
#define TSR_COMMANDS_H

int tsr_cmd_ckpt_ls(int argc, char **argv);
int tsr_cmd_ckpt_info(int argc, char **argv);
int tsr_cmd_ckpt_verify(int argc, char **argv);
int tsr_cmd_ckpt_repair(int argc, char **argv); /* ckpt verify --repair (cmd_repair.c) */
int tsr_cmd_ckpt_diff(int argc, char **argv);
int tsr_cmd_ckpt_synth(int argc, char **argv);
int tsr_cmd_ckpt_check(int argc, char **argv);
int tsr_cmd_ckpt_compact(int argc, char **argv);
int tsr_cmd_ckpt_fence(int argc, char **argv);
int tsr_cmd_bench_codec(int argc, char **argv);
int tsr_cmd_bench_plan(int argc, char **argv);
int tsr_cmd_bench_gpu(int argc, char **argv);
int tsr_cmd_bench_scale(int argc, char **argv);
int tsr_cmd_bench_save(int argc, char **argv);
int tsr_cmd_bench_load(int argc, char **argv);
int tsr_cmd_bench_disk(int argc, char **argv);
int tsr_cmd_bench_gemm(int argc, char **argv);
int tsr_cmd_train(int argc, char **argv);
int tsr_cmd_launch(int argc, char **argv);
int tsr_cmd_plot(int argc, char **argv);
int tsr_cmd_data_prep(int argc, char **argv);
int tsr_cmd_reshard(int argc, char **argv);
int tsr_cmd_logits(int argc, char **argv);
int tsr_cmd_export(int argc, char **argv);
int tsr_cmd_import(int argc, char **argv);
/* tsr_cmd_dcp(): `tessera import --from dcp SRC DST` (verb "import") and
 * `tessera export SRC --format dcp DST` ("export") through the Python package
 * (cmd_dcp.c); opt/val: one option passed on (NULL: none). */
int tsr_cmd_dcp(const char *verb, const char *src, const char *dst, const char *opt, const char *val);
int tsr_cmd_verify_export(int argc, char **argv); /* cmd_verify_export.c */
int tsr_cmd_push(int argc, char **argv);
int tsr_cmd_pull(int argc, char **argv);
int tsr_cmd_ls(int argc, char **argv);
int tsr_cmd_rm(int argc, char **argv);

#endif
