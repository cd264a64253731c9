-- The reason codes of probation (issue 24): readmitted on probation, and probation over. The
-- list is the `ReasonCode` enum of the contracts; a test in crates/store holds it equal to the
-- latest of these migrations.
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
    'probation_over'
)) NOT VALID;
ALTER TABLE transitions VALIDATE CONSTRAINT transitions_reason_code_known;
