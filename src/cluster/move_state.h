#pragma once
// What a node keeps on its own disk about the moves it takes part in (server/cluster_move.cc),
// under its data dir, so that a node killed mid-move finishes or undoes the move when it starts
// again and a session is never on no node or on two:
//   moving/<id>    the journal of a move out of this node: written and fsynced before the
//                  catalog switch, with the archive's path once there is one, removed when the
//                  move is over either way;
//   incoming/<id>  the mark of a session on its way here: while it is there, this node makes no
//                  session of that id (service/placement.cc), so a request that creates cannot
//                  make it anew, empty, before the archive arrives.
// And the archive files a move leaves: <archive>.spec.json, the session's spec beside it (the
// restore reads it: session_manager.cc). All calls block (the pool).

#include <string>
#include <vector>

#include "common/error.h"

namespace agentbox::cluster {

struct MoveJournal {
  std::string to;           // the target node
  std::string old_value;    // the catalog entry before the move
  std::string moved_value;  // the entry naming `to`
  std::string spec;         // session::encode_spec
  std::string tenant;
  std::string archive;  // "" until the session is archived
};

// data_dir/moving/<id>, whole or not at all (tmp + fsync + rename).
Status write_move_journal(const std::string& data_dir, const std::string& id, const MoveJournal& j);
Result<MoveJournal> read_move_journal(const std::string& data_dir, const std::string& id);
void remove_move_journal(const std::string& data_dir, const std::string& id);
bool has_move_journal(const std::string& data_dir, const std::string& id);
// The ids with a journal. A journal never written whole (a ".tmp") goes: no move began.
std::vector<std::string> move_journals(const std::string& data_dir);

// data_dir/incoming/<id>: set (fsynced), cleared, asked.
Status mark_incoming(const std::string& data_dir, const std::string& id);
Status unmark_incoming(const std::string& data_dir, const std::string& id);
bool is_incoming(const std::string& data_dir, const std::string& id);

// `spec` as <archive>.spec.json.
Status write_spec_sidecar(const std::string& archive, const std::string& spec);
// The archive and what lies beside it (.spec.json, .mounts.json).
Status remove_archive(const std::string& archive);
// The newest archive a destroy made of session `id` in `dir` (not one received from another
// node), or "".
std::string newest_archive(const std::string& dir, const std::string& id);
// The archive an interrupted move out of this node made of session `id` in `archives` (the
// newest, if written after the move's journal), or "": a node killed between the archive and
// the destroy still has the session, and the archive is the move's leftover.
std::string archive_of_move(const std::string& data_dir, const std::string& archives,
                            const std::string& id);

}  // namespace agentbox::cluster
