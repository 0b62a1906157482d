-- Issue 24, item 3: the schema's contract (ARCHITECTURE.md, "Schema contract"). Each
-- `worker-host migrate` (or start with `migrate_on_start`) that moves the schema records here
-- which release did it and whether it ran a contract step, so that an older binary meeting
-- migrations it does not know can tell a schema it still runs on (only expand steps since its
-- own) from one it must refuse (a contract step removed something it uses).
CREATE TABLE schema_releases (
    -- The highest migration applied when the release recorded this row: the row covers every
    -- migration above the previous row's version up to this one.
    version        bigint      PRIMARY KEY,
    -- The release (the host's version) that applied them.
    release        text        NOT NULL CHECK (release <> ''),
    -- contract: among the migrations the row covers, `contract_steps` are contract steps (their
    -- file is marked `-- contract:`); expand: none is.
    kind           text        NOT NULL CHECK (kind IN ('expand', 'contract')),
    contract_steps bigint[]    NOT NULL DEFAULT '{}',
    migrated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'contract') = (cardinality(contract_steps) > 0))
);
