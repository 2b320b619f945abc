// Proves the test bed: two RC QPs on one real verbs device, an RDMA READ of a
// registered buffer, the completion checked and the data verified. Raw verbs
// on purpose, so that it depends on nothing but rdma-core and the device.

#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/device_env.h"

namespace {

constexpr int kPort = 1;

// Index of the RoCE v2 IPv4-mapped GID (::ffff:a.b.c.d), which rxe on a
// loopback netdev needs; -1 if there is none (InfiniBand: use the LID).
int FindIpv4MappedGid(ibv_context* ctx, int gid_table_len) {
  for (int i = 0; i < gid_table_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(ctx, kPort, i, &gid) != 0) continue;
    static constexpr std::array<uint8_t, 12> kPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(gid.raw, kPrefix.data(), kPrefix.size()) == 0) return i;
  }
  return -1;
}

struct Endpoint {
  ibv_qp* qp = nullptr;
  ibv_gid gid{};
  uint16_t lid = 0;
};

void Connect(ibv_qp* qp, const Endpoint& peer, int gid_index, ibv_mtu mtu) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(
      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = peer.qp->qp_num;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = kPort;
  a.ah_attr.dlid = peer.lid;
  if (gid_index >= 0) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = gid_index;
    a.ah_attr.grh.hop_limit = 1;
  }
  ASSERT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = 12;
  a.retry_cnt = 2;
  a.rnr_retry = 2;
  a.max_rd_atomic = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                              IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
            0);
}

TEST(RdmaSmoke, ReadOfRegisteredBufferReturnsItsBytes) {
  KVNODE_REQUIRE_DEVICE(device);
  std::printf("[ device   ] %s port %d\n", device.name.c_str(), device.port);

  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i) {
    if (device.name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);

  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(ctx, kPort, &port), 0);
  const bool roce = port.link_layer == IBV_LINK_LAYER_ETHERNET;
  const int gid_index = roce ? FindIpv4MappedGid(ctx, port.gid_tbl_len) : -1;
  if (roce) {
    ASSERT_GE(gid_index, 0) << "RoCE port without an IPv4-mapped GID";
  }

  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);

  constexpr size_t kLen = 64 * 1024;
  std::vector<uint8_t> remote(kLen), local(kLen, 0);
  for (size_t i = 0; i < kLen; ++i) remote[i] = static_cast<uint8_t>(i * 131 + 7);
  ibv_mr* remote_mr = ibv_reg_mr(pd, remote.data(), kLen, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(remote_mr, nullptr);
  ibv_mr* local_mr = ibv_reg_mr(pd, local.data(), kLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(local_mr, nullptr);

  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 4;
  init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  Endpoint a, b;
  a.qp = ibv_create_qp(pd, &init);
  b.qp = ibv_create_qp(pd, &init);
  ASSERT_NE(a.qp, nullptr);
  ASSERT_NE(b.qp, nullptr);
  a.lid = b.lid = port.lid;
  if (roce) {
    ASSERT_EQ(ibv_query_gid(ctx, kPort, gid_index, &a.gid), 0);
    b.gid = a.gid;
  }
  const ibv_mtu mtu = port.active_mtu;
  Connect(a.qp, b, gid_index, mtu);
  Connect(b.qp, a, gid_index, mtu);

  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(local.data());
  sge.length = kLen;
  sge.lkey = local_mr->lkey;
  ibv_send_wr wr{};
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote.data());
  wr.wr.rdma.rkey = remote_mr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);

  ibv_wc wc{};
  int got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((got = ibv_poll_cq(cq, 1, &wc)) == 0 && std::chrono::steady_clock::now() < deadline) {
  }
  ASSERT_EQ(got, 1) << "no completion for the READ within 10 s";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc.wr_id, 42u);
  EXPECT_EQ(local, remote);

  // Teardown in the order the man pages require: QPs, then MRs, CQ, PD, device.
  EXPECT_EQ(ibv_destroy_qp(a.qp), 0);
  EXPECT_EQ(ibv_destroy_qp(b.qp), 0);
  EXPECT_EQ(ibv_dereg_mr(remote_mr), 0);
  EXPECT_EQ(ibv_dereg_mr(local_mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
