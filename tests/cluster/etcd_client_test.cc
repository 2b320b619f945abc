// EtcdClient and Watcher against a real etcd (etcd_fixture.h).
#include "kvnode/cluster/etcd_client.h"

#include <atomic>
#include <mutex>

#include "etcd_fixture.h"
#include "gtest/gtest.h"

namespace kvnode::cluster {
namespace {

using kvnode::testing::EtcdTest;
using kvnode::testing::WaitUntil;

class EtcdClientTest : public EtcdTest {};

TEST_F(EtcdClientTest, PutGetDeleteAndPrefix) {
  auto c = NewClient();
  ASSERT_TRUE(c->Put("/t/a", "1").ok());
  ASSERT_TRUE(c->Put("/t/b", "2").ok());
  ASSERT_TRUE(c->Put("/u", "3").ok());
  auto a = c->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  auto range = c->GetPrefix("/t/");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[1].key, "/t/b");
  EXPECT_GT(range->revision, 0);
  EXPECT_EQ(*c->Delete("/t/a"), 1);
  EXPECT_FALSE(c->Get("/t/a")->has_value());
}

TEST_F(EtcdClientTest, CasRefusesAStaleRevision) {
  auto c = NewClient();
  auto created = c->PutIfModRevision("/t/map", "v1", 0);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(created->applied);
  auto again = c->PutIfModRevision("/t/map", "other", 0);  // must not exist: it does
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->applied);
  ASSERT_TRUE(again->current.has_value());
  EXPECT_EQ(again->current->value, "v1");
  const int64_t rev1 = again->current->mod_revision;
  auto v2 = c->PutIfModRevision("/t/map", "v2", rev1);
  ASSERT_TRUE(v2.ok() && v2->applied);
  auto stale = c->PutIfModRevision("/t/map", "v3", rev1);  // rev1 is stale now
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->applied);
  EXPECT_EQ(stale->current->value, "v2");
  EXPECT_EQ((*c->Get("/t/map"))->value, "v2");
}

TEST_F(EtcdClientTest, TwoKeyCasPutsOnlyWhenBothRevisionsHold) {
  auto c = NewClient();
  // Guarded by an absent key (revision 0), then by its revision once it exists.
  auto put = c->PutIfModRevisions("/t/plan", "p1", 0, "/t/other", 0);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(put->applied);
  auto other = c->Put("/t/other", "o1");
  ASSERT_TRUE(other.ok());
  auto stale_guard = c->PutIfModRevisions("/t/plan", "p2", put->revision, "/t/other", 0);
  ASSERT_TRUE(stale_guard.ok());
  EXPECT_FALSE(stale_guard->applied);
  ASSERT_TRUE(stale_guard->guard.has_value());
  EXPECT_EQ(stale_guard->guard->mod_revision, *other);
  EXPECT_EQ(stale_guard->current->value, "p1");
  ASSERT_TRUE(c->PutIfModRevisions("/t/plan", "p2", put->revision, "/t/other", *other)->applied);
  // Both keys in one revision, or neither.
  auto both_stale =
      c->PutBothIfModRevisions({"/t/plan", "p3", put->revision}, {"/t/other", "o2", *other});
  ASSERT_TRUE(both_stale.ok());
  EXPECT_FALSE(both_stale->applied);
  EXPECT_EQ((*c->Get("/t/other"))->value, "o1");
  const int64_t plan_rev = both_stale->current->mod_revision;
  auto both = c->PutBothIfModRevisions({"/t/plan", "p3", plan_rev}, {"/t/other", "o2", *other});
  ASSERT_TRUE(both.ok() && both->applied);
  EXPECT_EQ((*c->Get("/t/plan"))->mod_revision, both->revision);
  EXPECT_EQ((*c->Get("/t/other"))->mod_revision, both->revision);
}

TEST_F(EtcdClientTest, LeaseExpiryDeletesTheKeyWithinTtlPlusOneSecond) {
  auto c = NewClient();
  auto lease = c->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(c->Put("/t/member", "x", lease->id).ok());
  auto ttl = c->LeaseKeepAliveOnce(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GE(*ttl, 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitUntil([&] { return !c->Get("/t/member")->has_value(); },
                        std::chrono::seconds(lease->ttl_s + 1)));
  EXPECT_LE(std::chrono::steady_clock::now() - start, std::chrono::seconds(lease->ttl_s + 1));
  EXPECT_TRUE(absl::IsNotFound(c->LeaseKeepAliveOnce(lease->id).status()));
  EXPECT_TRUE(absl::IsNotFound(c->LeaseTimeToLive(lease->id).status()));
}

// The live upgrade's lease handoff: the old process's client goes away, the
// new one keeps the same lease alive, and the key stays.
TEST_F(EtcdClientTest, AnotherClientKeepsTheLeaseAfterTheFirstIsGone) {
  int64_t lease = 0;
  int64_t ttl_s = 0;
  {
    auto old_client = NewClient();
    auto granted = old_client->LeaseGrant(2);
    ASSERT_TRUE(granted.ok()) << granted.status();
    lease = granted->id;
    ttl_s = granted->ttl_s;
    ASSERT_TRUE(old_client->Put("/t/member", "x", lease).ok());
  }
  auto new_client = NewClient();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2 * ttl_s + 1);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(new_client->LeaseKeepAliveOnce(lease).ok());
    ASSERT_TRUE((*new_client->Get("/t/member")).has_value());
    std::this_thread::sleep_for(
        std::chrono::milliseconds(ttl_s * 1000 / 3));  // the keepalive period
  }
  ASSERT_TRUE(new_client->LeaseRevoke(lease).ok());
  EXPECT_FALSE((*new_client->Get("/t/member")).has_value());
}

// Collects what a Watcher delivers.
struct Sink {
  std::mutex mu;
  std::vector<WatchUpdate> updates;
  WatchCallbacks Callbacks() {
    return {.on_update =
                [this](const WatchUpdate& u) {
                  std::lock_guard<std::mutex> l(mu);
                  updates.push_back(u);
                },
            .on_state = nullptr};
  }
  // The value of `key` after everything delivered so far ("" none).
  std::string ValueOf(const std::string& key) {
    std::lock_guard<std::mutex> l(mu);
    std::string v;
    for (const auto& u : updates) {
      if (u.resync) v.clear();
      for (const auto& kv : u.snapshot) {
        if (kv.key == key) v = kv.value;
      }
      for (const auto& e : u.events) {
        if (e.kv.key == key) v = e.type == WatchEvent::Type::kDelete ? "" : e.kv.value;
      }
    }
    return v;
  }
};

TEST_F(EtcdClientTest, WatchDeliversASnapshotThenChanges) {
  auto c = NewClient();
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "m1").ok());
  ASSERT_TRUE(c->Put("/kvnode/c2/map", "other cluster").ok());
  Sink sink;
  auto w = c->Watch("/kvnode/c1/", 0, sink.Callbacks());
  ASSERT_TRUE(WaitUntil([&] { return sink.ValueOf("/kvnode/c1/map") == "m1"; }));
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "m2").ok());
  ASSERT_TRUE(WaitUntil([&] { return sink.ValueOf("/kvnode/c1/map") == "m2"; }));
  ASSERT_TRUE(c->Delete("/kvnode/c1/map").ok());
  ASSERT_TRUE(WaitUntil([&] { return sink.ValueOf("/kvnode/c1/map").empty(); }));
  EXPECT_EQ(sink.ValueOf("/kvnode/c2/map"), "");
  EXPECT_EQ(w->resyncs(), 1);
}

// A watch whose revision is compacted away re-reads the prefix (a resync)
// and goes on watching.
TEST_F(EtcdClientTest, WatchResyncsAfterCompaction) {
  auto c = NewClient();
  auto first = c->Put("/kvnode/c1/map", "m1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "m2").ok());
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "m3").ok());
  auto now = c->Get("/kvnode/c1/map");
  ASSERT_TRUE(now.ok());
  ASSERT_TRUE(c->Compact((*now)->mod_revision).ok());
  Sink sink;
  auto w = c->Watch("/kvnode/c1/", *first, sink.Callbacks());  // from a compacted revision
  ASSERT_TRUE(WaitUntil([&] { return w->resyncs() == 1; }));
  EXPECT_EQ(sink.ValueOf("/kvnode/c1/map"), "m3");
  {
    std::lock_guard<std::mutex> l(sink.mu);
    ASSERT_FALSE(sink.updates.empty());
    EXPECT_TRUE(sink.updates.front().resync);  // no event from before the compaction
  }
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "m4").ok());
  EXPECT_TRUE(WaitUntil([&] { return sink.ValueOf("/kvnode/c1/map") == "m4"; }));
}

TEST_F(EtcdClientTest, WatchSurvivesAnEtcdRestart) {
  auto c = NewClient();
  Sink sink;
  std::atomic<int> errors{0};
  WatchCallbacks cb = sink.Callbacks();
  cb.on_state = [&](const absl::Status& s) { errors += s.ok() ? 0 : 1; };
  auto w = c->Watch("/kvnode/c1/", 0, std::move(cb));
  ASSERT_TRUE(WaitUntil([&] { return w->resyncs() == 1; }));
  etcd().Stop();
  ASSERT_TRUE(WaitUntil([&] { return errors > 0; }));
  ASSERT_TRUE(etcd().Start());
  ASSERT_TRUE(c->Put("/kvnode/c1/map", "after").ok());
  EXPECT_TRUE(WaitUntil([&] { return sink.ValueOf("/kvnode/c1/map") == "after"; }));
}

TEST_F(EtcdClientTest, OversizedValueIsAnErrorNamingTheKey) {
  EtcdClientOptions opts;
  opts.endpoints = {etcd().endpoint()};
  opts.max_value_size = 16;
  auto c = EtcdClient::Connect(opts);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put("/t/big", std::string(100, 'x')).ok());
  auto got = (*c)->Get("/t/big");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("/t/big"), absl::string_view::npos) << got.status();
}

TEST(EtcdClientNoServerTest, CallsFailWithinTheirDeadline) {
  EtcdClientOptions opts;
  opts.endpoints = {absl::StrCat("127.0.0.1:", kvnode::testing::FreePort())};
  opts.rpc_deadline = absl::Milliseconds(300);
  auto c = EtcdClient::Connect(opts);
  ASSERT_TRUE(c.ok());
  const auto start = std::chrono::steady_clock::now();
  auto got = (*c)->Get("/x");
  EXPECT_TRUE(absl::IsUnavailable(got.status()) || absl::IsDeadlineExceeded(got.status()))
      << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(EtcdClientOptionsTest, EndpointsAreValidated) {
  EXPECT_TRUE(ParseEndpoints("127.0.0.1:2379,h:1").ok());
  auto bad = ParseEndpoints("127.0.0.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--etcd_endpoints"), absl::string_view::npos);
  EXPECT_FALSE(ParseEndpoints("").ok());
  EXPECT_FALSE(ParseEndpoints("h:0").ok());
  auto url = ParseEndpoints("http://127.0.0.1:2379");
  ASSERT_FALSE(url.ok());
  EXPECT_NE(url.status().message().find("is a URL"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvnode::cluster
