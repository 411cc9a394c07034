//! The `outbox_events` table as a SeaORM entity (CONTRACT §2).
//!
//! The table name is configurable at run time, so the sidecar builds its
//! statements against the name it is given and uses this entity for the
//! column set, the row type ([`outbox_event::Model`]) and the status enum.

pub mod outbox_event;

pub use outbox_event::{Entity as OutboxEvent, Model as OutboxEventRow, Payload, Sequence, Status};

/// The table name the Rails application (and the sidecar by default) uses.
pub const DEFAULT_TABLE: &str = "outbox_events";
