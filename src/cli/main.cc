// agentbox: the command-line client of agentboxd. Thin: parse the command line, run one command.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <iostream>

#include "cli/cli.h"
#include "cli/doctor.h"

namespace {

using namespace agentbox::cli;

// Adds a --flag that fills an optional<T>.
template <class T>
CLI::Option* add_optional(CLI::App* app, const std::string& name, std::optional<T>& out,
                          const std::string& help) {
  return app->add_option_function<T>(
      name, [&out](const T& v) { out = v; }, help);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agentbox: sessions, commands and files of an agentboxd server", "agentbox"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may come after the subcommand too
  app.footer(
      std::string("Processes: agentbox start|ps|logs|kill|attach|shell (REF = tag or pid)\n\n"
                  "Environment (a flag given on the command line wins):\n"
                  "  AGENTBOX_URL    the server, as --server\n"
                  "  AGENTBOX_TOKEN  the bearer token, as --token\n"
                  "  WAIT_FOR_SIDECAR, WAIT_FOR_SIDECAR_TIMEOUT  `agentbox wait`'s URL "
                  "and seconds (seed 001)\n\n") +
      kExitCodesHelp);

  Globals g;
  app.add_option("--server", g.server, "agentboxd URL, http://host:port")
      ->envname("AGENTBOX_URL")
      ->capture_default_str();
  app.add_option("--token", g.token,
                 "bearer token, sent as 'Authorization: Bearer' (default: none; needed when the "
                 "daemon has tokens)")
      ->envname("AGENTBOX_TOKEN");

  std::function<int()> run;

  // ---- template ----
  CLI::App* tmpl = app.add_subcommand("template", "push, list, build, roll back and remove templates");
  tmpl->require_subcommand(1);
  std::string t_file, t_name;
  std::uint64_t t_version = 0;
  bool t_json = false;
  CLI::App* t_push = tmpl->add_subcommand("push", "upload a template (YAML file, '-' = stdin)");
  t_push->add_option("file", t_file, "the YAML file")->required();
  t_push->callback([&] { run = [&] { return template_push(g, t_file); }; });
  CLI::App* t_ls = tmpl->add_subcommand("ls", "list templates");
  t_ls->add_flag("--json", t_json, "print the server's JSON");
  t_ls->callback([&] { run = [&] { return template_ls(g, t_json); }; });
  CLI::App* t_build = tmpl->add_subcommand("build", "build a snapshot, printing the log");
  t_build->add_option("name", t_name, "template name")->required();
  t_build->callback([&] { run = [&] { return template_build(g, t_name); }; });
  CLI::App* t_rb = tmpl->add_subcommand("rollback", "make an older snapshot version current");
  t_rb->add_option("name", t_name, "template name")->required();
  t_rb->add_option("version", t_version, "snapshot version")->required();
  t_rb->callback([&] { run = [&] { return template_rollback(g, t_name, t_version); }; });
  CLI::App* t_rm = tmpl->add_subcommand("rm", "remove a template (refused while sessions use it)");
  t_rm->add_option("name", t_name, "template name")->required();
  t_rm->callback([&] { run = [&] { return template_rm(g, t_name); }; });

  // ---- image ----
  CLI::App* img = app.add_subcommand("image", "pull, list, inspect and remove images");
  img->require_subcommand(1);
  std::string i_ref;
  bool i_json = false;
  CLI::App* i_pull = img->add_subcommand("pull", "pull an image from its registry");
  i_pull->add_option("ref", i_ref, "image reference (registry/repo:tag)")->required();
  i_pull->callback([&] { run = [&] { return image_pull(g, i_ref); }; });
  CLI::App* i_ls = img->add_subcommand("ls", "list the pulled images");
  i_ls->add_flag("--json", i_json, "print the server's JSON");
  i_ls->callback([&] { run = [&] { return image_ls(g, i_json); }; });
  CLI::App* i_inspect = img->add_subcommand("inspect", "show one image as JSON");
  i_inspect->add_option("ref", i_ref, "image reference or digest")->required();
  i_inspect->callback([&] { run = [&] { return image_inspect(g, i_ref); }; });
  CLI::App* i_rm = img->add_subcommand("rm", "remove an image (refused while sessions use it)");
  i_rm->add_option("digest", i_ref, "image digest (sha256:...)")->required();
  i_rm->callback([&] { run = [&] { return image_rm(g, i_ref); }; });

  // ---- session ----
  CLI::App* session = app.add_subcommand(
      "session", "create, list, show, suspend, resume and remove sessions; add mounts");
  session->require_subcommand(1);

  SessionCreateArgs create;
  CLI::App* s_create =
      session->add_subcommand("create", "create a session, or get the existing one");
  s_create->add_option("id", create.id, "session id ([A-Za-z0-9._-]{1,128})");
  s_create->add_option("--scope", create.scope,
                       "id template, e.g. '{launcher_type}_{launcher_id}'");
  s_create->add_option("--var", create.vars, "template variable NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  s_create->add_option("--backend", create.backend,
                       "backend (ns, host, ...); server default if unset");
  s_create->add_option("--runner", create.runner,
                       "remote runner user serving the session (backend remote)");
  s_create->add_option("--env", create.env, "environment variable K=V for the box (repeatable)")
      ->allow_extra_args(false);
  s_create->add_option("--label", create.labels, "label K=V (repeatable)")->allow_extra_args(false);
  // Unset limits and TTL are the server's defaults (its config), which `session show` prints.
  add_optional(s_create, "--memory-mb", create.memory_mb,
               "memory limit in MiB (default: the server's)");
  add_optional(s_create, "--cpu-percent", create.cpu_percent,
               "CPU limit, 100 = one core (default: the server's)");
  add_optional(s_create, "--max-pids", create.max_pids, "process limit (default: the server's)");
  add_optional(s_create, "--disk-mb", create.disk_mb,
               "workspace size cap in MiB (default: the server's)");
  add_optional(s_create, "--cpu-time", create.cpu_time_sec,
               "CPU seconds per command; killed past it (default: the server's)");
  add_optional(s_create, "--tmp-mb", create.tmp_mb, "size of /tmp in MiB (default: the server's)");
  add_optional(s_create, "--max-open-files", create.max_open_files,
               "open files per process (default: the server's)");
  s_create
      ->add_option("--network", create.network,
                   "network mode: none (loopback only), allowlist (the --allow domains through "
                   "the egress proxy) or open (default: none)")
      ->check(CLI::IsMember({"none", "allowlist", "open"}));
  s_create
      ->add_option("--allow", create.allow,
                   "a domain the box may reach, e.g. example.org or *.example.org (repeatable; "
                   "implies --network allowlist)")
      ->allow_extra_args(false);
  add_optional(s_create, "--ttl", create.ttl_sec,
               "idle seconds before the server suspends it, 0: never (default: the server's)");
  s_create
      ->add_option("--mount", create.mounts,
                   "host dir mounted in the box, HOST:BOX[:ro|rw] (default rw; repeatable)")
      ->allow_extra_args(false);
  s_create
      ->add_option("--skill", create.skills,
                   "skill NAME=DIR, mounted at /workspace/.skills/NAME in the server's default "
                   "mode (repeatable)")
      ->allow_extra_args(false);
  s_create->add_option("--host-path", create.host_path,
                       "host dir that is the workspace itself, DIR[:ro] (mounted at /workspace, "
                       "rw by default; never deleted or archived by the server)");
  s_create->add_flag("-q,--quiet", create.quiet, "print only the session id");
  s_create->add_option("--image", create.image,
                       "the box's root: an image reference or digest (ns backend; pulled on "
                       "first use)");
  s_create->add_flag("--writable-root", create.writable_root,
                     "with --image: a writable root layer of the session's own");
  s_create->add_option("--template", create.template_ref,
                       "start on a template's snapshot, NAME or NAME@VERSION");
  s_create->callback([&] { run = [&] { return session_create(g, create); }; });

  bool ls_json = false;
  CLI::App* s_ls = session->add_subcommand("ls", "list sessions");
  s_ls->alias("list");
  s_ls->add_flag("--json", ls_json, "print the server's JSON");
  s_ls->callback([&] { run = [&] { return session_ls(g, ls_json); }; });

  bool runners_json = false;
  CLI::App* runners =
      app.add_subcommand("runners", "list the remote runners and whether they are connected");
  runners->add_flag("--json", runners_json, "print the server's JSON");
  runners->callback([&] { run = [&] { return runners_ls(g, runners_json); }; });

  std::string show_id;
  CLI::App* s_show = session->add_subcommand("show", "show one session as JSON");
  s_show->add_option("id", show_id, "session id")->required();
  s_show->callback([&] { run = [&] { return session_show(g, show_id); }; });

  std::string rm_id;
  bool rm_archive = false;
  CLI::App* s_rm = session->add_subcommand("rm", "destroy a session and its workspace");
  s_rm->alias("delete");
  s_rm->add_option("id", rm_id, "session id")->required();
  s_rm->add_flag("--archive", rm_archive, "archive the workspace first; prints the archive path");
  s_rm->callback([&] { run = [&] { return session_rm(g, rm_id, rm_archive); }; });

  std::string restore_id;
  std::string restore_archive;
  CLI::App* s_restore = session->add_subcommand(
      "restore", "make a new session from an archive that `session rm --archive` wrote");
  s_restore->add_option("id", restore_id, "id of the new session (must not exist)")->required();
  s_restore
      ->add_option("archive", restore_archive,
                   "the archive's path on the server (under its data_dir/archives)")
      ->required();
  s_restore->callback(
      [&] { run = [&] { return session_restore(g, restore_id, restore_archive); }; });

  MountsAddArgs madd;
  CLI::App* s_mounts = session->add_subcommand("mounts", "mounts and skills of a session");
  s_mounts->require_subcommand(1);
  CLI::App* s_madd = s_mounts->add_subcommand(
      "add", "add mounts or skills to an existing session (live, or at its next start)");
  s_madd->add_option("id", madd.id, "session id")->required();
  s_madd
      ->add_option("--mount", madd.mounts,
                   "host dir mounted in the box, HOST:BOX[:ro|rw] (default rw; repeatable)")
      ->allow_extra_args(false);
  s_madd
      ->add_option("--skill", madd.skills,
                   "skill NAME=DIR, mounted at /workspace/.skills/NAME (repeatable)")
      ->allow_extra_args(false);
  s_madd
      ->add_option("--skill-mode", madd.skill_mode,
                   "ro|rw for the --skill dirs (default: the server's, rw)")
      ->check(CLI::IsMember({"ro", "rw"}));
  s_madd->add_flag("--json", madd.json, "print the server's JSON");
  s_madd->callback([&] { run = [&] { return session_mounts_add(g, madd); }; });

  agentbox::cli::SessionLimitsArgs lim;
  CLI::App* s_lim = session->add_subcommand(
      "limits", "change a session's limits; a running box takes them at once");
  s_lim->add_option("id", lim.id, "session id")->required();
  add_optional(s_lim, "--memory-mb", lim.memory_mb, "memory limit in MiB");
  add_optional(s_lim, "--cpu-percent", lim.cpu_percent, "CPU limit, 100 = one core");
  add_optional(s_lim, "--max-pids", lim.max_pids, "process limit");
  add_optional(s_lim, "--cpu-time-sec", lim.cpu_time_sec, "CPU seconds per command");
  add_optional(s_lim, "--tmp-mb", lim.tmp_mb, "size of /tmp in MiB (suspended sessions only)");
  add_optional(s_lim, "--max-open-files", lim.max_open_files,
               "open files per process (suspended sessions only)");
  add_optional(s_lim, "--disk-mb", lim.disk_mb, "workspace size cap in MiB (cannot change)");
  s_lim->add_flag("--json", lim.json, "print the server's JSON");
  s_lim->callback([&] { run = [&] { return agentbox::cli::session_limits(g, lim); }; });

  std::string life_id;
  for (const char* action : {"suspend", "resume", "keepalive"}) {
    std::string help = std::string(action) == "suspend"
                           ? "stop the box (processes end, the workspace stays); any use resumes"
                       : std::string(action) == "resume" ? "start a suspended session's box again"
                                                         : "mark a session used (resets its TTL)";
    CLI::App* sub = session->add_subcommand(action, help);
    sub->add_option("id", life_id, "session id")->required();
    sub->callback(
        [&, action] { run = [&, action] { return session_lifecycle(g, life_id, action); }; });
  }

  // ---- network ----
  agentbox::cli::NetworkArgs net;
  CLI::App* netc = app.add_subcommand(
      "network", "set a session's network mode; a running session switches at once");
  netc->add_option("session", net.id, "session id")->required();
  netc->add_option("mode", net.mode, "none, allowlist or open")
      ->required()
      ->check(CLI::IsMember({"none", "allowlist", "open"}));
  netc->add_option("--allow", net.allow, "allowed domain with allowlist (repeatable)")
      ->allow_extra_args(false);
  netc->add_flag("--json", net.json, "print the server's JSON");
  netc->callback([&] { run = [&] { return agentbox::cli::network(g, net); }; });

  // ---- exec ----
  ExecArgs ex;
  CLI::App* exec = app.add_subcommand(
      "exec", "run a command in a session (created if missing), streaming its output");
  exec->footer("Usage: agentbox exec [OPTIONS] SESSION [--] CMD [ARGS...]");
  // Like `docker exec`: everything from the first word that is not an exec option on (or after
  // "--") is the command, so `agentbox exec s1 ls -la` works.
  exec->prefix_command();
  exec->fallthrough(false);  // the command's own flags are not ours
  exec->add_option("session", ex.session, "session id")->required();
  exec->add_option("-c,--command", ex.command, "a shell command line, run by /bin/sh -c");
  exec->add_option("--cwd", ex.cwd, "working directory in the box (default: the workspace)");
  exec->add_option("--env", ex.env, "environment variable K=V (repeatable)")
      ->allow_extra_args(false);
  add_optional(exec, "--timeout", ex.timeout_sec,
               "seconds before the command is killed, exit 124 (default: the server's)");
  exec->add_flag("-i,--stdin", ex.send_stdin, "send our stdin to the command");
  std::vector<std::string> after_dashes;
  bool has_dashes = false;
  exec->callback([&] {
    // `exec S foo -- bar` runs "foo -- bar": a "--" after the command started is its own.
    ex.argv = exec->remaining();
    if (!ex.argv.empty() && ex.argv.front().size() > 1 && ex.argv.front()[0] == '-') {
      throw CLI::ValidationError(
          "exec", "unknown option " + ex.argv.front() + " (put the command after --)");
    }
    if (has_dashes && !ex.argv.empty()) ex.argv.push_back("--");
    ex.argv.insert(ex.argv.end(), after_dashes.begin(), after_dashes.end());
    run = [&] { return agentbox::cli::exec(g, ex); };
  });

  // ---- processes and terminals ----
  // start and shell take their command like exec: everything after "--" (cut off below).
  StartArgs st;
  CLI::App* start = app.add_subcommand(
      "start", "start a background process in a session (created if missing); prints it");
  start->footer(
      "Usage: agentbox start [OPTIONS] SESSION -- CMD [ARGS...]\n"
      "The process outlives this command: see it with `ps`, read it with `logs`, talk to it "
      "with `attach`, end it with `kill`. REF elsewhere is its tag or its pid.");
  start->prefix_command();
  start->fallthrough(false);
  start->add_option("session", st.session, "session id")->required();
  start->add_option("-c,--command", st.command, "a shell command line, run by /bin/sh -c");
  start->add_option("--tag", st.tag, "a name for it, unique among the session's live processes");
  start->add_option("--restart", st.restart,
                    "never|on-failure|always: restart it when it ends (managed; the server "
                    "answers 501 where that is not built)");
  start->add_flag("--pty", st.pty,
                  "run it on a terminal of our terminal's size (80x24 if none): `attach` is "
                  "then a terminal");
  start->add_flag("-i,--stdin", st.send_stdin,
                  "keep its stdin open, for `attach` in line mode and POST .../stdin");
  start->add_option("--cwd", st.cwd, "working directory in the box (default: the workspace)");
  start->add_option("-e,--env", st.env, "environment variable K=V (repeatable)")
      ->allow_extra_args(false);
  start->add_flag("-q,--quiet", st.quiet, "print only the pid");
  start->callback([&] {
    st.argv = start->remaining();
    if (!st.argv.empty() && st.argv.front().size() > 1 && st.argv.front()[0] == '-') {
      throw CLI::ValidationError(
          "start", "unknown option " + st.argv.front() + " (put the command after --)");
    }
    if (has_dashes && !st.argv.empty()) st.argv.push_back("--");
    st.argv.insert(st.argv.end(), after_dashes.begin(), after_dashes.end());
    run = [&] { return agentbox::cli::start(g, st); };
  });

  std::string ps_session;
  bool ps_json = false;
  CLI::App* ps = app.add_subcommand(
      "ps", "list a session's processes: running ones and those ended in the last 10 minutes");
  ps->add_option("session", ps_session, "session id")->required();
  ps->add_flag("--json", ps_json, "print the server's JSON");
  ps->callback([&] { run = [&] { return agentbox::cli::ps(g, ps_session, ps_json); }; });

  std::string logs_session, logs_ref;
  bool logs_follow = false;
  CLI::App* logs =
      app.add_subcommand("logs", "print a process's output (stdout to stdout, stderr to stderr)");
  logs->add_option("session", logs_session, "session id")->required();
  logs->add_option("ref", logs_ref, "the process: its tag or pid")->required();
  logs->add_flag("-f,--follow", logs_follow,
                 "keep printing until the process ends; a dropped connection is resumed where "
                 "it stopped, nothing lost or repeated");
  logs->callback(
      [&] { run = [&] { return agentbox::cli::logs(g, logs_session, logs_ref, logs_follow); }; });

  std::string kill_session, kill_ref, kill_signal;
  CLI::App* killc =
      app.add_subcommand("kill", "end a process and everything it started (or send it a signal)");
  killc->add_option("session", kill_session, "session id")->required();
  killc->add_option("ref", kill_ref, "the process: its tag or pid")->required();
  killc->add_option("-s,--signal", kill_signal,
                    "send this signal instead (INT, TERM, KILL, HUP, USR1, USR2, or a number)");
  killc->callback(
      [&] { run = [&] { return agentbox::cli::kill(g, kill_session, kill_ref, kill_signal); }; });

  std::string attach_session, attach_ref;
  CLI::App* attachc = app.add_subcommand(
      "attach", "attach to a process: its terminal (a --pty process), else its stdio by lines");
  attachc->footer(
      "A pty process: our terminal goes raw, keys go to the process, Ctrl-] detaches.\n"
      "Otherwise each line of our stdin is sent to the process's stdin and each line it "
      "prints comes back; at the end of our stdin it stays attached (Ctrl-C detaches).\n"
      "Exits with the process's exit code when it ends (128+N when killed by signal N).");
  attachc->add_option("session", attach_session, "session id")->required();
  attachc->add_option("ref", attach_ref, "the process: its tag or pid")->required();
  attachc->callback(
      [&] { run = [&] { return agentbox::cli::attach(g, attach_session, attach_ref); }; });

  std::string shell_session;
  std::vector<std::string> shell_argv;
  CLI::App* shellc = app.add_subcommand(
      "shell", "an interactive terminal in a session (created if missing), like docker exec -it");
  shellc->footer(
      "Usage: agentbox shell SESSION [-- CMD [ARGS...]]   (default: bash, else sh)\n"
      "Raw terminal, resized with ours; ends with the shell and exits with its exit code. "
      "When stdin is not a terminal, its end is sent as ^D.");
  shellc->prefix_command();
  shellc->fallthrough(false);
  shellc->add_option("session", shell_session, "session id")->required();
  shellc->callback([&] {
    shell_argv = shellc->remaining();
    if (has_dashes && !shell_argv.empty()) shell_argv.push_back("--");
    shell_argv.insert(shell_argv.end(), after_dashes.begin(), after_dashes.end());
    run = [&] { return agentbox::cli::shell(g, shell_session, shell_argv); };
  });

  // ---- files ----
  std::string cp_from, cp_to;
  bool cp_parents = false;
  CLI::App* cp = app.add_subcommand(
      "cp", "copy a file: LOCAL SESSION:PATH or SESSION:PATH LOCAL ('-' = stdin/stdout)");
  cp->add_option("from", cp_from, "source")->required();
  cp->add_option("to", cp_to, "destination")->required();
  cp->add_flag("-p,--parents", cp_parents, "create missing parent directories in the box");
  cp->callback([&] { run = [&] { return agentbox::cli::cp(g, cp_from, cp_to, cp_parents); }; });

  std::string ls_target;
  bool ls_long = false;
  CLI::App* ls = app.add_subcommand("ls", "list a directory of a session (default: its workspace)");
  ls->add_option("target", ls_target, "SESSION or SESSION:PATH")->required();
  ls->add_flag("-l", ls_long, "long format: mode, size, time");
  ls->callback([&] { run = [&] { return agentbox::cli::ls(g, ls_target, ls_long); }; });

  std::string cat_target;
  CLI::App* cat = app.add_subcommand("cat", "print a file of a session");
  cat->add_option("target", cat_target, "SESSION:PATH")->required();
  cat->callback([&] { run = [&] { return agentbox::cli::cat(g, cat_target); }; });

  std::string rm_target;
  bool rm_recursive = false;
  CLI::App* rm = app.add_subcommand("rm", "remove a file or directory of a session");
  rm->add_option("target", rm_target, "SESSION:PATH")->required();
  rm->add_flag("-r,-R,--recursive", rm_recursive, "remove a directory and its contents");
  rm->callback([&] { run = [&] { return agentbox::cli::rm(g, rm_target, rm_recursive); }; });

  std::string mkdir_target;
  CLI::App* mkdir =
      app.add_subcommand("mkdir", "create a directory (and its parents) in a session");
  mkdir->add_option("target", mkdir_target, "SESSION:PATH")->required();
  bool mkdir_parents = false;  // accepted out of habit: parents are always created
  mkdir->add_flag("-p,--parents", mkdir_parents, "accepted; parents are always created");
  mkdir->callback([&] { run = [&] { return agentbox::cli::mkdir(g, mkdir_target); }; });

  std::string stat_target;
  bool stat_json = false;
  CLI::App* stat = app.add_subcommand("stat", "show a file's type, size, mode and time");
  stat->add_option("target", stat_target, "SESSION:PATH")->required();
  stat->add_flag("--json", stat_json, "print the server's JSON");
  stat->callback([&] { run = [&] { return agentbox::cli::stat(g, stat_target, stat_json); }; });

  std::string mv_from, mv_to;
  CLI::App* mv = app.add_subcommand(
      "mv", "rename or move a file or directory within a session (into TO if it is a directory)");
  mv->alias("rename");
  mv->add_option("from", mv_from, "SESSION:PATH")->required();
  mv->add_option("to", mv_to, "SESSION:PATH or PATH, in the same session")->required();
  mv->callback([&] { run = [&] { return agentbox::cli::mv(g, mv_from, mv_to); }; });

  // ---- health ----
  std::string check_id;
  bool check_json = false;
  for (const char* action : {"health", "repair"}) {
    bool repair = std::string(action) == "repair";
    CLI::App* sub = app.add_subcommand(
        action, repair ? "repair a session's failing checks, then check again (exit 11: still "
                         "unhealthy)"
                       : "run a session's health checks (exit 11: unhealthy)");
    sub->add_option("id", check_id, "session id")->required();
    sub->add_flag("--json", check_json, "print the server's JSON");
    sub->callback([&, action] {
      run = [&, action] { return session_check(g, check_id, action, check_json); };
    });
  }

  // ---- install ----
  agentbox::cli::InstallArgs inst;
  CLI::App* instc = app.add_subcommand(
      "install", "install packages in a session's workspace (pip: /workspace/.venv, npm: "
                 "/workspace/node_modules), recorded in pyproject.toml / package.json");
  instc->add_option("session", inst.id, "session id")->required();
  instc->add_option("manager", inst.manager, "pip or npm")->required();
  instc->add_option("packages", inst.packages, "requirement specs, package names or paths")
      ->required();
  instc->add_flag("--no-persist", inst.no_persist, "do not record them in the manifest");
  instc->add_option("--index-url", inst.index_url, "pip: the package index");
  instc->add_option("--find-links", inst.find_links, "pip: a dir or URL of archives (repeatable)");
  instc->add_flag("--no-index", inst.no_index, "pip: only --find-links, no index");
  instc->add_flag("--json", inst.json, "print the server's JSON");
  instc->callback([&] { run = [&] { return agentbox::cli::install(g, inst); }; });

  // ---- mcp ----
  std::string mcp_session;
  CLI::App* mcpc = app.add_subcommand(
      "mcp", "serve a session's MCP tools over stdio (for desktop agents; created if missing)");
  mcpc->footer(
      "Reads one JSON-RPC message per line on stdin and writes the replies on stdout, through "
      "the daemon's POST /v1/sessions/SESSION/mcp; diagnostics go to stderr. Ends (exit 0) at "
      "the end of stdin.");
  mcpc->add_option("session", mcp_session, "session id")->required();
  mcpc->callback([&] {
    run = [&] { return agentbox::cli::mcp_stdio(g, mcp_session, STDIN_FILENO, STDOUT_FILENO); };
  });

  // ---- doctor ----
  std::string d_config, d_data_dir, d_backend;
  bool d_no_daemon = false;
  CLI::App* doctorc = app.add_subcommand(
      "doctor",
      "check that this host can run agentboxd as configured: kernel features, cgroups, "
      "nftables, the data dir, etcd (cluster mode) and the daemon's /readyz; says how to fix "
      "what is missing; exit 1 when the default backend cannot run here");
  doctorc->add_option("--config", d_config,
                      "agentboxd's YAML config (default: /etc/agentbox/agentboxd.yaml when it "
                      "exists)");
  doctorc->add_option("--data-dir", d_data_dir, "the data dir to check (default: the config's)");
  doctorc->add_option("--backend", d_backend,
                      "the default backend to check for (default: the "
                      "config's, else ns)");
  doctorc->add_flag("--no-daemon", d_no_daemon, "do not ask the daemon's /readyz");
  doctorc->callback([&] {
    run = [&] {
      namespace dr = agentbox::cli::doctor;
      dr::Target t;
      std::string file = d_config;
      if (file.empty() && ::access("/etc/agentbox/agentboxd.yaml", R_OK) == 0) {
        file = "/etc/agentbox/agentboxd.yaml";
      }
      if (!g.token.empty()) t.token = g.token;
      if (!file.empty()) {
        if (auto err = dr::load_target(file, &t)) return usage(*err);
      }
      if (!d_data_dir.empty()) t.data_dir = d_data_dir;
      if (!d_backend.empty()) t.backend = d_backend;
      if (app.get_option("--server")->count() > 0) t.server = g.server;
      return dr::run(t, d_no_daemon);
    };
  });

  // ---- wait ----
  std::string wait_url;
  std::optional<std::uint32_t> wait_timeout;
  CLI::App* wait = app.add_subcommand(
      "wait", "wait until agentboxd answers GET /healthz with 200 (seed 001's WAIT_FOR_SIDECAR)");
  wait->add_option("url", wait_url,
                   "[http://]HOST:PORT (default: $WAIT_FOR_SIDECAR, else --server)");
  add_optional(wait, "--timeout", wait_timeout,
               "seconds to wait; exit 5 when they pass (default: $WAIT_FOR_SIDECAR_TIMEOUT, "
               "else 60)");
  wait->callback([&] { run = [&] { return agentbox::cli::wait(g, wait_url, wait_timeout); }; });

  // CLI11 hands what follows "--" to positionals and, with none left, to the parent app; for
  // exec, start and shell it is the command, so it is cut off here before parsing. The
  // subcommand is the first word that is neither a global flag nor its value.
  std::vector<std::string> args(argv + 1, argv + argc);
  auto sub = args.begin();
  while (sub != args.end() && sub->starts_with("-")) {
    bool takes_value = (*sub == "--server" || *sub == "--token");
    ++sub;
    if (takes_value && sub != args.end()) ++sub;
  }
  if (sub != args.end() && (*sub == "exec" || *sub == "start" || *sub == "shell")) {
    if (auto d = std::find(sub, args.end(), "--"); d != args.end()) {
      has_dashes = true;
      after_dashes.assign(d + 1, args.end());
      args.erase(d, args.end());
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);  // prints the message
    return kExitUsage;
  }
  if (!run) return kExitUsage;
  return run();
}
