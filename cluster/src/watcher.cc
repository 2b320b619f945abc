#include "kvnode/cluster/etcd_client.h"
