-- The reason codes of a probation whose weight grows (issue 39): its weight growing after a run
-- of passes, and held again at the first failure. The list is the `ReasonCode` enum of the
-- contracts; a test in crates/store holds it equal to the latest of these migrations. The
-- transitions table is partitioned by month (0011): the constraint is the parent's, checked on
-- every partition.
ALTER TABLE transitions DROP CONSTRAINT transitions_reason_code_known;
ALTER TABLE transitions ADD CONSTRAINT transitions_reason_code_known CHECK (reason_code IN (
    'ejected',
    'degraded',
    'suspect',
    'cleared',
    'recovered',
    'trial_failed',
    'trial_succeeded',
    'failed_while_recovering',
    'ejection_refused',
    'forced_healthy',
    'forced_unhealthy',
    'maintenance_on',
    'override_cleared',
    'readmitted',
    'cooldown',
    'cooldown_over',
    'outage_over',
    'probation',
    'probation_growing',
    'probation_held',
    'probation_over'
));
