//! Schema for the outbox table (CONTRACT §2), runnable against a table the
//! application already created.
//!
//! Every step checks before it acts (`IF NOT EXISTS`, an index probe), so
//! `outbox-sidecar migrate` can run against the Rails app's existing
//! `outbox_events`, or twice, without touching a row. The table name is
//! configurable, which is why the migration carries it as data instead of
//! being a unit struct.

pub use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

/// The table name the Rails application uses.
pub const DEFAULT_TABLE: &str = "outbox_events";

/// SeaORM's migrator over the default table name, for `sea-orm-cli` users.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateOutboxEvents::new(DEFAULT_TABLE))]
    }
}

/// Creates the outbox table and its status index when they are missing.
pub struct CreateOutboxEvents {
    table: String,
}

impl CreateOutboxEvents {
    pub fn new(table: &str) -> Self {
        Self {
            table: table.to_owned(),
        }
    }

    pub fn status_index_name(&self) -> String {
        format!("index_{}_on_status", self.table)
    }
}

/// Applies the schema to `db` for `table`; safe to run any number of times.
pub async fn apply<'c, C>(db: C, table: &str) -> Result<(), DbErr>
where
    C: sea_orm_migration::IntoSchemaManagerConnection<'c>,
{
    CreateOutboxEvents::new(table)
        .up(&SchemaManager::new(db))
        .await
}

impl MigrationName for CreateOutboxEvents {
    fn name(&self) -> &str {
        "m20261130_000001_create_outbox_events"
    }
}

#[derive(DeriveIden)]
enum Col {
    Id,
    EventName,
    Payload,
    Status,
    Attempts,
    LastError,
    SentAt,
    CreatedAt,
    UpdatedAt,
}

/// Creates index `name` on `table`(`col`) unless an index of that name
/// exists (an index probe: `IF NOT EXISTS` is not portable).
async fn ensure_index<T: IntoIden + 'static>(
    manager: &SchemaManager<'_>,
    table: &str,
    name: &str,
    col: T,
) -> Result<(), DbErr> {
    ensure_index_of(manager, table, name, col, None).await
}

/// As [`ensure_index`], of type `kind` (`USING kind` on PostgreSQL).
async fn ensure_index_of<T: IntoIden + 'static>(
    manager: &SchemaManager<'_>,
    table: &str,
    name: &str,
    col: T,
    kind: Option<&'static str>,
) -> Result<(), DbErr> {
    if manager.has_index(table, name).await? {
        return Ok(());
    }
    let mut index = Index::create();
    index.name(name).table(Alias::new(table)).col(col);
    if let Some(kind) = kind {
        index.index_type(sea_orm::sea_query::IndexType::Custom(
            Alias::new(kind).into_iden(),
        ));
    }
    manager.create_index(index.to_owned()).await
}

/// Rails writes `datetime(6)` on MySQL; a bare `datetime` would cut
/// `updated_at` to whole seconds and make retry spacing imprecise.
fn timestamp_col<T: IntoIden>(backend: DbBackend, col: T) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("datetime(6)")),
        _ => def.date_time(),
    };
    def
}

#[async_trait::async_trait]
impl MigrationTrait for CreateOutboxEvents {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let table = Alias::new(&self.table);
        manager
            .create_table(
                Table::create()
                    .table(table.clone())
                    .if_not_exists()
                    .col(
                        ColumnDef::new(Col::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Col::EventName).string().not_null())
                    .col(ColumnDef::new(Col::Payload).json_binary().not_null())
                    .col(
                        ColumnDef::new(Col::Status)
                            .string()
                            .not_null()
                            .default("pending"),
                    )
                    .col(
                        ColumnDef::new(Col::Attempts)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .col(ColumnDef::new(Col::LastError).text().null())
                    .col(timestamp_col(backend, Col::SentAt).null())
                    .col(timestamp_col(backend, Col::CreatedAt).not_null())
                    .col(timestamp_col(backend, Col::UpdatedAt).not_null())
                    .to_owned(),
            )
            .await?;

        ensure_index(manager, &self.table, &self.status_index_name(), Col::Status).await
    }

    /// Deliberately not provided: the table may belong to the application
    /// and hold its data, so the sidecar never drops it.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Err(DbErr::Migration(format!(
            "refusing to drop table {:?}: it may hold the application's events",
            self.table
        )))
    }
}

/// The attempt log (`history.table`): one row per attempt and per resend,
/// beside the application's table and never joined to it by a foreign key
/// (the application may delete its rows; the log is pruned on its own).
pub struct CreateAttemptLog {
    table: String,
}

impl CreateAttemptLog {
    pub fn new(table: &str) -> Self {
        Self {
            table: table.to_owned(),
        }
    }
}

#[derive(DeriveIden)]
enum Log {
    Id,
    EventId,
    Kind,
    Attempt,
    StartedAt,
    DurationMs,
    Outcome,
    HttpStatus,
    Detail,
    Replica,
    Via,
    Label,
    TraceId,
}

/// Creates the attempt log `table` and its indexes when missing.
pub async fn apply_attempt_log<'c, C>(db: C, table: &str) -> Result<(), DbErr>
where
    C: sea_orm_migration::IntoSchemaManagerConnection<'c>,
{
    CreateAttemptLog::new(table)
        .up(&SchemaManager::new(db))
        .await
}

impl MigrationName for CreateAttemptLog {
    fn name(&self) -> &str {
        "m20261201_000001_create_outbox_event_attempts"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateAttemptLog {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let table = Alias::new(&self.table);
        manager
            .create_table(
                Table::create()
                    .table(table.clone())
                    .if_not_exists()
                    .col(
                        ColumnDef::new(Log::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Log::EventId).big_integer().not_null())
                    .col(ColumnDef::new(Log::Kind).string_len(16).not_null())
                    .col(ColumnDef::new(Log::Attempt).integer().null())
                    .col(timestamp_col(backend, Log::StartedAt).not_null())
                    .col(ColumnDef::new(Log::DurationMs).integer().null())
                    .col(ColumnDef::new(Log::Outcome).string_len(16).null())
                    .col(ColumnDef::new(Log::HttpStatus).integer().null())
                    .col(ColumnDef::new(Log::Detail).text().null())
                    .col(ColumnDef::new(Log::Replica).string_len(255).null())
                    .col(ColumnDef::new(Log::Via).string_len(32).null())
                    .col(ColumnDef::new(Log::Label).string_len(255).null())
                    .col(ColumnDef::new(Log::TraceId).string_len(32).null())
                    .to_owned(),
            )
            .await?;
        // A log created before trace context (`[tracing]`) gains its column.
        if !manager.has_column(&self.table, "trace_id").await? {
            manager
                .alter_table(
                    Table::alter()
                        .table(table.clone())
                        .add_column(ColumnDef::new(Log::TraceId).string_len(32).null())
                        .to_owned(),
                )
                .await?;
        }
        let index = format!("index_{}_on_event_id", self.table);
        ensure_index(manager, &self.table, &index, Log::EventId).await?;
        // Rows arrive in started_at order, which is what a BRIN index is
        // for: prune finds the old ones through it, and it costs next to
        // nothing per insert (a b-tree here cost the log a tenth of its
        // write cost: benches/RESULTS.md). MySQL and SQLite have no BRIN.
        let kind = (backend == DbBackend::Postgres).then_some("brin");
        let index = format!("index_{}_on_started_at", self.table);
        ensure_index_of(manager, &self.table, &index, Log::StartedAt, kind).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(Alias::new(&self.table))
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

/// Paused dispatchers (`dispatch.pause_table`): a row per paused
/// dispatcher, read by every replica.
pub struct CreatePauses {
    table: String,
}

#[derive(DeriveIden)]
enum Pause {
    Dispatcher,
    PausedAt,
    Via,
    Label,
}

/// Creates the pause `table` when missing.
pub async fn apply_pauses<'c, C>(db: C, table: &str) -> Result<(), DbErr>
where
    C: sea_orm_migration::IntoSchemaManagerConnection<'c>,
{
    CreatePauses {
        table: table.to_owned(),
    }
    .up(&SchemaManager::new(db))
    .await
}

impl MigrationName for CreatePauses {
    fn name(&self) -> &str {
        "m20261201_000002_create_outbox_dispatcher_pauses"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreatePauses {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(Alias::new(&self.table))
                    .if_not_exists()
                    .col(
                        ColumnDef::new(Pause::Dispatcher)
                            .string_len(255)
                            .not_null()
                            .primary_key(),
                    )
                    .col(timestamp_col(backend, Pause::PausedAt).not_null())
                    .col(ColumnDef::new(Pause::Via).string_len(32).not_null())
                    .col(ColumnDef::new(Pause::Label).string_len(255).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(Alias::new(&self.table))
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

/// Operator actions (`dispatch.operations_table`): a row per resume,
/// retrigger or bulk resend started from the admin API, the console or
/// the CLI, with its progress, so any replica can say how it went.
pub struct CreateOperations {
    table: String,
}

#[derive(DeriveIden)]
enum Operation {
    Id,
    Kind,
    Target,
    State,
    Progress,
    Message,
    Error,
    Rerun,
    Replica,
    Via,
    Label,
    StartedAt,
    UpdatedAt,
    FinishedAt,
    Params,
    Cursor,
    CancelledAt,
}

/// Creates the operations `table` when missing.
pub async fn apply_operations<'c, C>(db: C, table: &str) -> Result<(), DbErr>
where
    C: sea_orm_migration::IntoSchemaManagerConnection<'c>,
{
    CreateOperations {
        table: table.to_owned(),
    }
    .up(&SchemaManager::new(db))
    .await
}

impl MigrationName for CreateOperations {
    fn name(&self) -> &str {
        "m20261207_000001_create_outbox_operations"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateOperations {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let table = Alias::new(&self.table);
        manager
            .create_table(
                Table::create()
                    .table(table.clone())
                    .if_not_exists()
                    .col(
                        ColumnDef::new(Operation::Id)
                            .string_len(64)
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Operation::Kind).string_len(32).not_null())
                    .col(ColumnDef::new(Operation::Target).text().not_null())
                    .col(ColumnDef::new(Operation::State).string_len(16).not_null())
                    .col(ColumnDef::new(Operation::Progress).big_integer().not_null())
                    .col(ColumnDef::new(Operation::Message).text().null())
                    .col(ColumnDef::new(Operation::Error).text().null())
                    .col(ColumnDef::new(Operation::Rerun).text().not_null())
                    .col(
                        ColumnDef::new(Operation::Replica)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(ColumnDef::new(Operation::Via).string_len(32).not_null())
                    .col(ColumnDef::new(Operation::Label).string_len(255).null())
                    .col(timestamp_col(backend, Operation::StartedAt).not_null())
                    .col(timestamp_col(backend, Operation::UpdatedAt).not_null())
                    .col(timestamp_col(backend, Operation::FinishedAt).null())
                    // A replay's filters and pace (JSON), how far it got
                    // (the last id it put back to pending), and when an
                    // operator asked it to stop.
                    .col(ColumnDef::new(Operation::Params).text().null())
                    .col(ColumnDef::new(Operation::Cursor).big_integer().null())
                    .col(timestamp_col(backend, Operation::CancelledAt).null())
                    .to_owned(),
            )
            .await?;
        // MySQL has no CREATE INDEX IF NOT EXISTS: looked up first.
        ensure_index(
            manager,
            &self.table,
            &format!("{}_started_at_idx", self.table),
            Operation::StartedAt,
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(Alias::new(&self.table))
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
