#!/usr/bin/env bash
# session 24 call 1: build, tests of the fused RoPE + store, A/B of QS_FUSE_ROPE_STORE
L=/tmp/logs; mkdir -p $L
export QS_COMMIT=$(cat .qs_commit)
save() { tar czf $OUT/logs.tgz -C /tmp logs; }
OUT=$L/check bash tools/gpu/check.sh build > $L/build.log 2>&1 || { tail -50 $L/build.log; save; exit 1; }
save
QS_TEST_FILTER='CudaOpsTest.RopeQk*:CudaOpsTest.StoreKv*:*CudaEngineTest*:TinyModels/CudaModelTest.*:CudaOpsTest.Programmatic*' OUT=$L/check bash tools/gpu/check.sh test > $L/test.log 2>&1
tail -5 $L/test.log; grep -h "rope_qk_store_kv\|FAILED\|PASSED" $L/check/*.log | head -20
save
source build-gpu/env.sh; source tools/gpu/lib.sh; OUT=$L qs_gpu_setup > $L/setup.log 2>&1; OUT=$L qs_make_model llama2-7b > $L/model.log 2>&1
for i in 1 2; do for f in 1 0; do
  QS_FUSE_ROPE_STORE=$f build-gpu/quantspec bench -m /tmp/qs-llama2-7b --device cuda --contexts 4096 --modes ar-fp16,quantspec --gammas 3 -n 48 > $L/qs-4096-f$f-r$i.txt 2>&1
  grep -h "^ar-\|^quantspec " $L/qs-4096-f$f-r$i.txt
done; done
save
for f in 1 0; do
  QS_FUSE_ROPE_STORE=$f build-gpu/quantspec bench -m /tmp/qs-llama2-7b --device cuda --contexts 131072 --modes quantspec --gammas 3 -n 48 > $L/qs-131072-f$f.txt 2>&1
  grep -h "^ar-\|^quantspec " $L/qs-131072-f$f.txt
  save
done
