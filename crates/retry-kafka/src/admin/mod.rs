//! Administration: the ladder's topics (`topics`: explicit creation,
//! start-up verification), the dead-letter topic (`dead_letters`: status,
//! browse, replay, acknowledge; `replay_lock`: one replay at a time across
//! instances; `dlq`: the backlog gauge) and a group's
//! offsets seen from outside (`offsets`), any partition read as written
//! (`records`), where the operators' pause of a listener is kept
//! (`pause`), and the lag of the ladder's groups (`lag`).

pub(crate) mod dead_letters;
pub(crate) mod dlq;
pub(crate) mod lag;
pub(crate) mod offsets;
pub(crate) mod pause;
pub(crate) mod records;
pub(crate) mod replay_lock;
pub(crate) mod topics;
