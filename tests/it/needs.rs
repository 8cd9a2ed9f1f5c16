//! What each integration test needs beyond what every broker gives, declared
//! here and nowhere else: `cargo xtask integration` reads this table
//! (xtask includes this file) to decide which broker runs which test, prints
//! what each run leaves out and why, and fails when the table names a test
//! that does not exist. A test's name says what it checks, never where it
//! runs: renaming a test without its line here fails the run.

/// What a test needs of the broker, or of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Apache Kafka itself: its nodes stopped, killed and restarted, its re-authentication on a live connection, its Java client, what only a real broker shows.
    ApacheKafka,
    /// The mock cluster's fault injection (errors, delays and leader moves per request), or what only the mock lacks.
    MockFaults,
    /// A broker that requires SASL.
    Sasl,
    /// A broker behind TLS.
    Tls,
    /// tansu's TLS terminator, which the test restarts to cut every connection at once.
    TlsProxy,
    /// A broker that requires client certificates (mutual TLS).
    ClientCert,
    /// CreateTopics.
    CreateTopics,
    /// DeleteRecords.
    DeleteRecords,
    /// ListOffsets by time: the first record at or after a time.
    OffsetsByTime,
    /// Offset commits from the ending generation while a rebalance is prepared.
    CommitsDuringRebalances,
    /// Transactions that commit (EndTxn).
    Transactions,
    /// A topic's max.message.bytes enforced.
    MessageLimits,
    /// Record batches stored as producers wrote them (compressed, any size).
    BatchesKept,
    /// Offset-commit metadata kept.
    CommitMetadata,
    /// The consumer group protocol (KIP-848: ConsumerGroupHeartbeat).
    ConsumerProtocol,
    /// Listeners on the classic group protocol (JoinGroup rounds).
    ClassicProtocol,
    /// Nothing: the test chooses its group protocol itself, so it runs in
    /// one pass per broker (the classic one), not again in the consumer
    /// protocol's.
    OwnProtocol,
    /// Nothing: the test starts no listener (no member of a group, no
    /// service that runs one), so the group protocol of a pass changes
    /// nothing for it: it runs in the classic pass, not again in the
    /// consumer protocol's. The suite checks the claim: such a test that
    /// asks which protocol to speak fails.
    NoListener,
    /// A broker without the consumer group protocol (tansu).
    NoConsumerProtocol,
    /// A group whose leader left during a rebalance electing another.
    LeaderReelection,
    /// A broker that drops offset-commit metadata (the test checks what happens there).
    CommitMetadataDropped,
    /// Much time (crash recovery of the service): left out of the passes that repeat the suite through security settings.
    LongRun,
    /// A cluster with an authorizer, and a SCRAM user no ACL names (Apache Kafka through SASL).
    Authorizer,
    /// A broker of its own (tansu's binary, `$KAFKA_RETRY_TANSU`, or a stand-in), reached in plaintext, with settings the suite's broker does not have: it runs once, on tansu's plaintext pass.
    OwnBroker,
    /// A minute of its own (a provider outage, the same on every broker): it runs once, on Apache Kafka's whole pass.
    OncePerRun,
}

/// Every test that needs more than every broker gives, by its path.
pub(crate) const NEEDS: &[(&str, &[Need])] = &[
    ("check::a_wrong_ca_or_no_tls_fails_with_the_setting_to_fix", &[Need::Tls]),
    ("check::a_wrong_password_fails_the_security_check_without_showing_it", &[Need::Sasl]),
    ("check::the_consumer_group_protocol_is_checked_against_the_broker", &[Need::NoConsumerProtocol]),
    ("check::a_broker_advertised_where_it_cannot_be_reached_fails_its_own_check", &[Need::OwnBroker]),
    ("check::a_broker_too_old_for_the_service_is_named_with_what_it_lacks", &[Need::OwnBroker]),
    ("check::a_user_without_acls_is_told_which_to_grant", &[Need::Authorizer]),
    ("billing::a_kill_mid_stream_charges_every_event_exactly_once", &[Need::LongRun]),
    (
        "billing::a_rolling_restart_of_three_instances_charges_every_order_once",
        &[Need::CommitsDuringRebalances, Need::LeaderReelection, Need::LongRun],
    ),
    (
        "billing::a_rolling_restart_of_three_cooperative_instances_charges_every_order_once",
        &[Need::OwnProtocol, Need::CommitsDuringRebalances, Need::LeaderReelection, Need::LongRun],
    ),
    ("billing::an_engaged_brake_is_taken_up_by_the_next_owner_of_what_it_held", &[Need::CommitMetadata]),
    ("billing::an_outage_of_the_provider_fills_no_dead_letter_topic_with_the_brake", &[Need::OncePerRun]),
    ("billing::events_past_the_idempotency_window_are_dead_lettered_not_charged", &[Need::OffsetsByTime]),
    ("billing::faults::billing_charges_every_order_through_leader_moves_and_a_broker_outage", &[Need::MockFaults]),
    ("billing::the_consumer_group_protocol_is_refused_where_the_broker_lacks_it", &[Need::NoConsumerProtocol]),
    ("billing::faults::every_order_is_charged_once_through_a_killed_leader_and_coordinator", &[Need::ApacheKafka]),
    ("billing::faults::every_order_is_charged_once_through_a_rolling_restart", &[Need::ApacheKafka]),
    ("billing::faults::every_order_is_charged_once_through_connections_cut_by_the_broker", &[Need::TlsProxy]),
    (
        "billing::faults::replay_scale_twenty_thousand_dead_letters_two_instances_an_operator_and_a_pending_provider",
        &[Need::LeaderReelection],
    ),
    ("billing::faults::two_brokers_down_stall_loudly_and_lose_nothing", &[Need::ApacheKafka]),
    ("billing::orders_are_charged_through_sessions_of_seconds", &[Need::ApacheKafka, Need::Sasl]),
    ("billing::the_password_never_reaches_logs_or_metrics", &[Need::Sasl]),
    ("billing::topics_create_names_the_request_the_broker_lacks", &[Need::MockFaults]),
    ("broker_path::create_produce_and_fetch_a_record_with_headers", &[Need::NoListener]),
    ("broker_path::rskafka_metadata_for_a_missing_topic_auto_creates_it", &[Need::MockFaults]),
    ("dead_letters::a_partly_failed_replay_commits_what_it_published_and_a_repeat_does_the_rest", &[Need::MockFaults]),
    ("dead_letters::a_record_above_the_position_is_refused_with_the_reason", &[Need::CommitMetadataDropped]),
    ("dead_letters::dead_letters_deleted_unhandled_are_counted_as_lost", &[Need::DeleteRecords]),
    ("dead_letters::one_replay_at_a_time_across_instances", &[Need::LeaderReelection]),
    ("dead_letters::targeted_replays_are_recorded_and_never_repeated", &[Need::CommitMetadata]),
    ("faults::a_broker_down_for_ten_seconds_loses_nothing", &[Need::MockFaults]),
    ("faults::a_heartbeat_without_an_answer_is_given_up_within_the_session", &[Need::MockFaults]),
    ("faults::a_member_dropped_while_it_drains_abandons_its_records_at_once", &[Need::MockFaults]),
    ("faults::a_moved_coordinator_and_group_errors_are_survived", &[Need::MockFaults]),
    ("faults::a_partition_that_cannot_publish_stalls_visibly_and_resumes", &[Need::MockFaults]),
    ("faults::a_republication_tried_again_after_a_lost_answer_is_written_once", &[Need::ApacheKafka]),
    ("faults::a_slow_acknowledgement_holds_the_commit_position_not_the_records_after_it", &[Need::MockFaults]),
    ("faults::committed_offsets_that_cannot_be_read_yet_are_read_again_within_the_generation", &[Need::MockFaults]),
    ("faults::leader_moves_and_stale_out_of_range_answers_reset_nothing", &[Need::MockFaults]),
    ("faults::partitions_added_to_the_source_are_consumed", &[Need::MockFaults]),
    ("faults::refused_produce_requests_are_retried_or_split", &[Need::MockFaults]),
    ("faults::requests_that_never_answer_are_abandoned_and_their_connections_replaced", &[Need::MockFaults]),
    ("group::a_drain_longer_than_the_session_keeps_the_member_and_its_commit", &[Need::CommitsDuringRebalances]),
    (
        "group::a_member_joining_and_leaving_mid_traffic_stops_every_partition_when_eager",
        &[Need::OwnProtocol, Need::CommitsDuringRebalances],
    ),
    (
        "group::a_member_joining_and_leaving_mid_traffic_moves_only_what_it_must_when_cooperative",
        &[Need::OwnProtocol, Need::CommitsDuringRebalances],
    ),
    (
        "group::a_member_joining_and_leaving_mid_traffic_moves_only_what_it_must_under_the_consumer_protocol",
        &[Need::OwnProtocol, Need::ConsumerProtocol],
    ),
    ("group::a_java_consumer_shares_the_group_and_reads_the_dead_letters_as_written", &[Need::ApacheKafka]),
    ("group::a_member_stopped_while_it_joins_leaves_the_group", &[Need::ApacheKafka, Need::ClassicProtocol]),
    ("group::a_rebalance_lets_a_call_run_past_the_shutdown_grace", &[Need::CommitsDuringRebalances]),
    ("group::a_static_member_restarts_within_its_session_without_a_rebalance", &[Need::ApacheKafka]),
    ("interop::a_foreign_group_consumes_and_commits_what_rskafka_produced", &[Need::NoListener]),
    ("interop::records_of_an_aborted_transaction_reach_the_handler_as_documented", &[Need::MockFaults]),
    ("interop::rskafka_fetches_what_a_foreign_producer_wrote", &[Need::NoListener]),
    ("records::a_batch_that_fails_its_checksum_is_dead_lettered_as_it_is", &[Need::MockFaults]),
    ("records::a_batch_that_inflates_beyond_the_cap_is_dead_lettered_as_it_is", &[Need::BatchesKept]),
    ("records::a_record_too_large_for_its_retry_topic_is_dead_lettered", &[Need::MessageLimits]),
    ("records::records_of_aborted_transactions_never_reach_the_handler", &[Need::ApacheKafka]),
    ("records::transaction_markers_never_hold_a_partition", &[Need::Transactions]),
    ("sasl::a_client_without_credentials_is_refused", &[Need::Sasl]),
    ("sasl::a_connection_that_outlives_its_session_authenticates_again", &[Need::Sasl]),
    ("sasl::a_wrong_password_is_refused_naming_broker_user_and_mechanism", &[Need::Sasl]),
    ("sasl::billing_bin_with_a_wrong_password_exits_1_without_showing_it", &[Need::Sasl]),
    ("sasl::sessions_are_renewed_on_the_same_connection", &[Need::ApacheKafka, Need::Sasl]),
    ("spring::a_listener_migrated_from_spring_mid_stream_charges_each_order_once_when_due", &[Need::ApacheKafka]),
    ("spring::springs_dead_letters_are_shown_and_replayed_to_spring_by_billing_bin", &[Need::ApacheKafka]),
    ("spring::springs_dlt_handler_receives_what_billing_bin_dead_letters_in_springs_style", &[Need::ApacheKafka]),
    ("spring::the_spring_peer_retries_and_dead_letters_as_spring_writes_it", &[Need::NoListener, Need::ApacheKafka]),
    ("tls::a_broker_signed_by_an_untrusted_ca_is_refused", &[Need::Tls]),
    ("tls::a_client_without_a_certificate_is_refused", &[Need::ClientCert]),
    ("tls::a_host_name_the_certificate_lacks_is_refused_unless_verification_is_off", &[Need::Tls]),
    ("tls::billing_bin_names_each_tls_failure_and_exits_1", &[Need::Tls]),
    ("tls::billing_bin_without_a_certificate_exits_1", &[Need::ClientCert]),
    ("topics::creation_is_explicit_and_idempotent", &[Need::NoListener, Need::CreateTopics]),
    ("topics::retry_topics_need_as_many_partitions_as_the_source", &[Need::NoListener, Need::CreateTopics]),
    ("topics::verification_names_every_missing_topic", &[Need::NoListener]),
    ("window::a_revocation_with_a_full_window_hands_over_without_redelivery", &[Need::CommitsDuringRebalances]),
];
