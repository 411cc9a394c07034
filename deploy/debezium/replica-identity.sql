-- REPLICA IDENTITY FULL for outbox_events: recommended, not required.
--
-- Under the default identity (the primary key), PostgreSQL writes to the WAL
-- only what logical decoding strictly needs:
--   * an UPDATE that leaves a TOASTed column unchanged does not carry it, so
--     Debezium emits the jsonb `payload` as the placeholder string
--     "__debezium_unavailable_value" (every status write-back is such an
--     update once a payload is stored out of line, past about 2 kB compressed);
--   * a DELETE carries only the key: `before` is {"id": N} and nothing else.
-- outbox-sidecar treats a change event as a wake-up call and reads the row
-- from the database before acting, so it works either way. FULL makes the
-- topic itself complete and readable (replays, the dead-letter topic, other
-- consumers, debugging with a console consumer), at the price of the old row,
-- payload included, being written to the WAL on every UPDATE and DELETE.
--
-- Run as the table's owner. It takes a brief ACCESS EXCLUSIVE lock.

ALTER TABLE public.outbox_events REPLICA IDENTITY FULL;

-- Check: 'f' = full, 'd' = default (primary key).
SELECT relreplident
  FROM pg_class
 WHERE oid = 'public.outbox_events'::regclass;

-- With publication.autocreate.mode = filtered, Debezium creates the
-- publication itself, which needs the connector's role to own the table.
-- Otherwise create it once as the owner:
--
--   CREATE PUBLICATION outbox_sidecar FOR TABLE public.outbox_events;
