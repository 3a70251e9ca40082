# eighteenth session: verify steps at the default model's shape, main against 998ad82 (the twelfth session's vsmol)
export PYTHONUNBUFFERED=1
R=$PWD; O=${OUT:-/tmp/o}; mkdir -p $O
python3 old_s12/ngram_host.py > $O/ngram.txt 2>&1; cat $O/ngram.txt
v() { (cd $1 && timeout 170 python3 -m lab.scripts.verify_profile --shape smollm2-135m --context 6144 --ks 2,4,8 --steps 8 \
  --methods bf16,oscar --kv-gib 4 --out $O/v_$2 > $O/v_$2.log 2>&1); echo "== $2 exit $?"; grep -E "K=" $O/v_$2.log | head -n 12; }
v $R new1; v $R/old_s12 old1; v $R new2; v $R/old_s12 old2
cd $O && tar -czf v.tgz v_* && rm -rf v_*
