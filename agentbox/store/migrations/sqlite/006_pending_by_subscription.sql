-- Version 6: a run's pending outbox rows by subscription too. Each delivery to a
-- subscriber looked through every other pending row of its run to find its own
-- (queued behind them, or the next one once it is sent): with 1,000 subscribers,
-- a million row reads for one event. Now one index step: callbacks are the
-- rows whose subscription_id is NULL.
DROP INDEX IF EXISTS outbox_pending_run;
CREATE INDEX IF NOT EXISTS outbox_pending_run ON outbox (run_id, subscription_id, pk)
    WHERE state = 'pending';
